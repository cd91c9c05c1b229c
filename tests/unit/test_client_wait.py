"""`wait_until_serving`: what a starter of the service sees when it never comes up."""

from __future__ import annotations

from pathlib import Path

from dispatcher.cli.service_client import PORT_FILE, TOKEN_FILE, wait_until_serving


def test_a_process_that_exited_ends_the_wait_at_once(tmp_path: Path) -> None:
    calls: list[int] = []

    def alive() -> bool:
        calls.append(1)
        return False

    assert wait_until_serving(tmp_path, alive=alive, timeout_s=60) is False
    assert calls == [1]


def test_nobody_listening_on_the_written_port_times_out(tmp_path: Path) -> None:
    (tmp_path / PORT_FILE).write_text("1\n")  # nothing listens on port 1
    (tmp_path / TOKEN_FILE).write_text("token\n")
    assert wait_until_serving(tmp_path, alive=lambda: True, timeout_s=0.2, poll_s=0.01) is False
