"""A start that fails at any stage leaves nothing behind; stop is safe to repeat.

Each case runs the real service (demo servers, SQLite, Chromium where the
stage has it) and makes one stage fail, by a real fault where one is at hand
(a held lock, a taken port, a missing browser) and otherwise by making that
part's start raise. Afterwards this process must have no browser, no
listening socket and no task more than before, and the state dir must be free
for the next start.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import filelock
import psutil
import pytest

import demo.bootstrap
from demo.bootstrap import Demo
from dispatcher.errors import ConfigError, DispatcherError, LockHeld, StoreError
from dispatcher.notify.webhooks import Webhooks
from dispatcher.scheduling.scheduler import Scheduler
from dispatcher.service.core import Phase, Service
from dispatcher.service.statedir import LOCK_FILE, PORT_FILE
from dispatcher.settings import Settings
from tests.support.harness import API_PROFILES, WEB_PROFILES, profiles_dir

TIME_SCALE = 0.02


@dataclass(frozen=True)
class Leftovers:
    """What this process holds that a service could have left behind."""

    children: frozenset[int]
    listening: frozenset[int]
    tasks: frozenset[asyncio.Task[Any]]

    @classmethod
    def now(cls) -> Leftovers:
        me = psutil.Process()
        children = set()
        for child in me.children(recursive=True):
            try:
                if child.status() != psutil.STATUS_ZOMBIE:
                    children.add(child.pid)
            except psutil.NoSuchProcess:
                pass
        listening = {
            conn.laddr.port for conn in me.net_connections("tcp") if conn.status == "LISTEN"
        }
        tasks = asyncio.all_tasks() - {asyncio.current_task()}
        return cls(frozenset(children), frozenset(listening), frozenset(tasks))


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _settings(tmp_path: Path, profiles: tuple[str, ...], **overrides: Any) -> Settings:
    return Settings(
        state_dir=tmp_path / "state",
        profiles_dir=profiles_dir(tmp_path, profiles),
        time_scale=TIME_SCALE,
        demo=True,
        **overrides,
    )


def _fails(exc: Exception) -> Callable[..., Any]:
    async def fail(*args: Any, **kwargs: Any) -> Any:
        raise exc

    return fail


@contextmanager
def _taken_port() -> Iterator[int]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    try:
        yield sock.getsockname()[1]
    finally:
        sock.close()


async def _assert_nothing_left(service: Service, before: Leftovers, mask: int) -> None:
    after = Leftovers.now()
    assert after.children <= before.children, "a browser (or other child) outlived start"
    assert after.listening <= before.listening, "a server still listens"
    assert after.tasks <= before.tasks, f"tasks left running: {after.tasks - before.tasks}"
    assert _umask() == mask, "the process umask was not given back"
    assert not (service.state_dir / PORT_FILE).exists()
    assert service.phase is Phase.STOPPED
    await service.stop()  # a stop after a failed start is harmless
    assert service.phase is Phase.STOPPED


async def _start_fails(service: Service, error: type[Exception], match: str) -> None:
    mask = _umask()
    before = Leftovers.now()
    with pytest.raises(error, match=match):
        await service.start()
    await _assert_nothing_left(service, before, mask)
    # The state dir is free again: its lock can be taken at once.
    lock = filelock.FileLock(str(service.state_dir / LOCK_FILE), timeout=0)
    lock.acquire()
    lock.release()


async def test_a_held_state_dir_starts_nothing(tmp_path: Path) -> None:
    service = Service(_settings(tmp_path, API_PROFILES), demo=Demo())
    service.state_dir.mkdir(mode=0o700)
    held = filelock.FileLock(str(service.state_dir / LOCK_FILE), timeout=0)
    held.acquire()
    try:
        mask = _umask()
        before = Leftovers.now()
        with pytest.raises(LockHeld, match="another dispatcher is running"):
            await service.start()
        await _assert_nothing_left(service, before, mask)
        assert held.is_locked  # the other holder's lock is not released by the refusal
    finally:
        held.release()


async def test_a_demo_server_failing_stops_the_ones_already_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        demo.bootstrap, "start_demo_comfy", _fails(ConfigError("comfy demo refused"))
    )
    await _start_fails(
        Service(_settings(tmp_path, API_PROFILES), demo=Demo()), ConfigError, "comfy demo"
    )


async def test_the_demo_setting_without_the_demo_step_is_refused(tmp_path: Path) -> None:
    # The service never imports the demo: whoever makes it passes the demo's
    # start-up step in; a service made without it refuses, saying how to start.
    service = Service(_settings(tmp_path, API_PROFILES))
    await _start_fails(service, ConfigError, r"dispatcher serve --demo")


async def test_no_usable_profile_stops_the_demo_servers(tmp_path: Path) -> None:
    service = Service(_settings(tmp_path, ()), demo=Demo())
    await _start_fails(service, ConfigError, "no usable profiles")


async def test_a_store_that_cannot_open_stops_what_came_before(tmp_path: Path) -> None:
    (tmp_path / "db-is-a-dir").mkdir()
    settings = _settings(tmp_path, API_PROFILES, database_url=f"sqlite:///{tmp_path}/db-is-a-dir")
    await _start_fails(Service(settings, demo=Demo()), StoreError, "cannot open SQLite database")


async def test_a_runner_failing_to_start_closes_the_one_started_before(tmp_path: Path) -> None:
    # The API runner starts first (its clients open); the web runner refuses
    # a browser that is not an executable file.
    not_a_browser = tmp_path / "chromium"
    not_a_browser.write_text("")
    settings = _settings(
        tmp_path, API_PROFILES + WEB_PROFILES, browser_executable=str(not_a_browser)
    )
    await _start_fails(Service(settings, demo=Demo()), ConfigError, "is not an executable file")


async def test_webhooks_failing_to_start_stops_everything_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Webhooks, "start", _fails(DispatcherError("webhooks refused")))
    settings = _settings(
        tmp_path,
        API_PROFILES,
        webhook_urls=["http://127.0.0.1:9/hook"],
        webhook_secret="s" * 20,
    )
    await _start_fails(Service(settings, demo=Demo()), DispatcherError, "webhooks refused")


@pytest.mark.browser
@pytest.mark.timeout(60)
async def test_a_taken_port_closes_the_logged_in_browsers(tmp_path: Path) -> None:
    # Everything up to the API has started here, the demo accounts' browsers too.
    with _taken_port() as port:
        settings = _settings(tmp_path, API_PROFILES + WEB_PROFILES, port=port)
        await _start_fails(
            Service(settings, demo=Demo()), ConfigError, f"cannot bind 127.0.0.1:{port}"
        )


async def test_a_failure_after_the_port_file_removes_it_and_the_next_start_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with monkeypatch.context() as patch:

        def refuse(self: Scheduler) -> None:
            raise DispatcherError("scheduler refused")

        patch.setattr(Scheduler, "start", refuse)
        await _start_fails(
            Service(_settings(tmp_path, API_PROFILES), demo=Demo()),
            DispatcherError,
            "scheduler refused",
        )
    again = Service(_settings(tmp_path, API_PROFILES), demo=Demo())
    async with again:
        port = (again.state_dir / PORT_FILE).read_text().strip()
        assert again.url.endswith(f":{port}")
    assert not (again.state_dir / PORT_FILE).exists()


async def test_stop_twice_is_fine_and_a_stopped_service_does_not_start_again(
    tmp_path: Path,
) -> None:
    mask = _umask()
    before = Leftovers.now()
    service = Service(_settings(tmp_path, API_PROFILES), demo=Demo())
    await service.start()
    assert service.phase is Phase.STARTED
    await service.stop()
    await _assert_nothing_left(service, before, mask)
    with pytest.raises(RuntimeError, match="starts once; this one is stopped"):
        await service.start()
