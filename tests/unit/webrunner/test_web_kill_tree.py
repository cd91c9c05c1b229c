"""`kill_tree`: a browser's whole family dies, off the event loop, even under cancels.

Stand-in processes carry browser-like flags (no Chromium needed). A
"respawner" keeps forking a process onto the profile, as a zygote would
while we kill it: it makes the sweep run to its bound, long enough to see
whether the event loop is blocked meanwhile and whether a cancel cuts the
kill short.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from dispatcher.metrics import LoopLagProbe
from webrunner import browserkill
from webrunner.browserkill import kill_tree
from webrunner.selfcheck import find_leftovers

# The stand-in browser: one child, both with the profile's flag, both asleep.
_BROWSER = (
    "import subprocess, sys, time\n"
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', sys.argv[1]])\n"
    "print('ready', flush=True)\n"
    "time.sleep(60)\n"
)
# Not on the profile itself (its flag is in the environment), it keeps a
# dozen shells on the profile, replacing each one killed at once. Each shell
# waits on a pipe nobody writes to: no children, nothing left behind.
_RESPAWNER = (
    "import os\n"
    "argv = ['sh', '-c', 'read x', os.environ['FLAG']]\n"
    "r, w = os.pipe()\n"
    "stdin = [(os.POSIX_SPAWN_DUP2, r, 0)]\n"
    "alive = set()\n"
    "while True:\n"
    "    while len(alive) < 12:\n"
    "        alive.add(os.posix_spawn('/bin/sh', argv, os.environ, file_actions=stdin))\n"
    "    pid, _ = os.waitpid(-1, 0)\n"
    "    alive.discard(pid)\n"
)
SWEEP_S = 1.0


def family(proc: subprocess.Popen[bytes]) -> list[int]:
    main = psutil.Process(proc.pid)
    return [main.pid, *(c.pid for c in main.children(recursive=True))]


def alive(pids: list[int]) -> list[int]:
    found = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                found.append(pid)
        except psutil.NoSuchProcess:
            continue
    return found


@pytest.fixture
def profile(tmp_path: Path) -> Path:
    path = tmp_path / "profile"
    path.mkdir()
    return path


@pytest.fixture
def fake_browser(profile: Path) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _BROWSER, f"--user-data-dir={profile}"],
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    deadline = time.monotonic() + 30  # a Python start takes seconds under load
    while len(family(proc)) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)  # the child is on its way
    yield proc
    for pid in alive(family(proc) if proc.poll() is None else []):
        psutil.Process(pid).kill()
    proc.wait()
    proc.stdout.close()


@pytest.fixture
def respawner(profile: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(browserkill, "SWEEP_S", SWEEP_S)
    proc = subprocess.Popen(
        [sys.executable, "-c", _RESPAWNER],
        env={**os.environ, "FLAG": f"--user-data-dir={profile}"},
        start_new_session=True,
    )
    deadline = time.monotonic() + 10
    while not any(found.name == "sh" for _, found in find_leftovers(profile)[0]):
        assert time.monotonic() < deadline, "the respawner never started a process"
        time.sleep(0.01)
    yield
    os.killpg(proc.pid, 9)
    proc.wait()


async def test_the_browser_and_its_children_are_dead_when_it_returns(
    fake_browser: subprocess.Popen[bytes], profile: Path
) -> None:
    pids = family(fake_browser)
    assert len(pids) == 2

    survivors = await kill_tree(fake_browser, profile, None)

    assert survivors == []
    assert alive(pids) == []
    assert fake_browser.returncode == -9  # reaped by its Popen, exit code kept


async def test_a_long_kill_does_not_block_the_event_loop(
    fake_browser: subprocess.Popen[bytes], profile: Path, respawner: None
) -> None:
    probe = LoopLagProbe(interval_s=0.02)
    probe.start()
    pids = family(fake_browser)
    started = time.monotonic()
    try:
        survivors = await kill_tree(fake_browser, profile, None)
    finally:
        lag_s = probe.max_lag_s()
        await probe.stop()
    took_s = time.monotonic() - started

    # The respawner kept the sweep busy until its bound.
    assert SWEEP_S * 0.9 <= took_s < SWEEP_S + 3
    assert fake_browser.pid not in survivors
    assert alive(pids) == []
    # On the loop, the kill's seconds are a thread's: timers stay on time. A
    # kill on the loop would stall it for the whole sweep; a busy machine
    # alone delays a timer by a few tenths of a second.
    assert lag_s < SWEEP_S / 2, f"event loop stalled {lag_s:.3f} s during the kill"


async def test_a_cancelled_cleanup_still_waits_for_the_kill(
    fake_browser: subprocess.Popen[bytes], profile: Path, respawner: None
) -> None:
    pids = family(fake_browser)
    kill = asyncio.create_task(kill_tree(fake_browser, profile, None))
    started = time.monotonic()
    await asyncio.sleep(0.1)
    kill.cancel()
    await asyncio.sleep(0.1)
    kill.cancel()  # the second cancel of a cleanup, as at shutdown

    with pytest.raises(asyncio.CancelledError):
        await kill

    # The cancel went on only after the kill had run to its end.
    assert time.monotonic() - started >= SWEEP_S * 0.9
    assert alive(pids) == []
