"""`python -m dispatcher` on uvloop + httptools (the default when installed)
and on asyncio + h11 (the setting's fallback): the same service either way."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.helpers import REPO
from tests.support.procs import Proc, service_client, start_service, stop_proc, vendor_and_env


def _until_logged(service: Proc, line: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while line not in service.log():
        assert time.monotonic() < deadline, service.log()[-2000:]
        time.sleep(0.05)


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    ("loop", "parser"), [("auto", "auto"), ("uvloop", "httptools"), ("asyncio", "h11")]
)
def test_the_service_runs_tasks_reloads_and_stops_on_the_chosen_loop(
    tmp_path: Path, loop: str, parser: str
) -> None:
    vendor, _, env = vendor_and_env(tmp_path, ("demo-chat-api",), 1.0)
    env |= {
        "DISPATCHER_EVENT_LOOP": loop,
        "DISPATCHER_HTTP_PARSER": parser,
        "DISPATCHER_LOG_LEVEL": "DEBUG",
    }
    log = tmp_path / "service.log"
    service = None
    try:
        service = start_service(tmp_path / "state", env, log)
        expected = ("asyncio", "h11") if loop == "asyncio" else ("uvloop", "httptools")
        assert f"({expected[0]}, {expected[1]}; state dir" in service.log()
        with service_client(tmp_path / "state") as client:
            posted = client.post(
                "/v1/tasks", json={"model": "demo-chat-api", "params": {"prompt": "hi"}}
            )
            assert posted.status_code == 201, posted.text
            task_id = posted.json()["id"]
            deadline = time.monotonic() + 60
            while (task := client.get(f"/v1/tasks/{task_id}").json())["state"] != "success":
                assert task["state"] in ("pending", "running"), task
                assert time.monotonic() < deadline, task
                time.sleep(0.05)
            # A request the strict door refuses is refused on either parser.
            duplicate_keys = b'{"model": "demo-chat-api", "model": "x", "params": {}}'
            refused = client.post(
                "/v1/tasks", content=duplicate_keys, headers={"Content-Type": "application/json"}
            )
            assert refused.status_code == 400, refused.text
        # Once started, `serve` set start-up's objects aside from the garbage
        # collector (`service.collector`).
        _until_logged(service, "objects from start-up set aside")
        # Signal handlers live on the loop: SIGHUP reloads, SIGTERM stops cleanly.
        service.popen.send_signal(signal.SIGHUP)
        _until_logged(service, "profiles reloaded")
        assert service.terminate() == 0
        service = None
    finally:
        if service is not None:
            stop_proc(service.popen)
        stop_proc(vendor)


def test_an_unknown_event_loop_is_refused_at_start(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "dispatcher"],
        cwd=REPO,
        env={
            **os.environ,
            "DISPATCHER_STATE_DIR": str(tmp_path / "state"),
            "DISPATCHER_EVENT_LOOP": "trio",
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "DISPATCHER_EVENT_LOOP='trio'" in done.stdout + done.stderr
