"""The psutil self-check, on stand-in processes (no browser needed)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from webrunner.selfcheck import find_leftovers, pid_alive, self_check, singleton_owner

_SLEEPER = "import time\nprint('ready', flush=True)\nwhile True: time.sleep(1)"
Spawn = Callable[..., subprocess.Popen[bytes]]

_STUBBORN = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n" + _SLEEPER


@pytest.fixture
def spawn() -> Iterator[Spawn]:
    """Start stand-in processes with browser-like flags; reap them all afterwards."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(*flags: str, code: str = _SLEEPER) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            [sys.executable, "-c", code, *flags], stdout=subprocess.PIPE, start_new_session=True
        )
        procs.append(proc)
        # Wait until it runs its loop (and has its SIGTERM handler).
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def make_singletons(profile: Path, owner: str) -> None:
    profile.mkdir(exist_ok=True)
    os.symlink(owner, profile / "SingletonLock")
    os.symlink("/tmp/.org.chromium.Chromium.gone/SingletonSocket", profile / "SingletonSocket")
    os.symlink("8230742395842", profile / "SingletonCookie")


def singletons(profile: Path) -> list[str]:
    return sorted(p.name for p in profile.iterdir() if p.name.startswith("Singleton"))


def test_a_clean_profile_reports_nothing(tmp_path: Path) -> None:
    report = self_check(tmp_path / "profile")
    assert report.clean and report.ok
    assert report.summary().endswith("nothing left over")


def test_a_process_on_the_profile_is_terminated(tmp_path: Path, spawn: Spawn) -> None:
    profile = tmp_path / "profile"
    profile.mkdir()
    other = spawn(f"--user-data-dir={tmp_path / 'other'}")
    mine = spawn(f"--user-data-dir={profile}", "--remote-debugging-port=1")

    report = self_check(profile)

    assert [f.pid for f in report.found] == [mine.pid]
    assert report.found[0].matched_by == "user-data-dir"
    assert report.terminated == [mine.pid] and report.killed == []
    assert mine.wait(timeout=5) is not None
    assert other.poll() is None, "another profile's browser must be left alone"
    assert f"pid {mine.pid}" in report.summary()


def test_a_relative_or_symlinked_profile_path_still_matches(tmp_path: Path, spawn: Spawn) -> None:
    profile = tmp_path / "profile"
    profile.mkdir()
    (tmp_path / "alias").symlink_to(profile)
    proc = spawn(f"--user-data-dir={tmp_path / 'alias'}")
    matches, _ = find_leftovers(profile)
    assert [p.pid for p, _ in matches] == [proc.pid]


def test_a_process_ignoring_sigterm_is_killed_after_the_grace(tmp_path: Path, spawn: Spawn) -> None:
    profile = tmp_path / "profile"
    profile.mkdir()
    stubborn = spawn(f"--user-data-dir={profile}", code=_STUBBORN)

    started = time.monotonic()
    report = self_check(profile, kill_after_s=0.5)

    assert time.monotonic() - started >= 0.5
    assert report.terminated == [] and report.killed == [stubborn.pid]
    assert report.ok
    assert stubborn.wait(timeout=5) == -9


def test_the_recorded_debugging_port_matches_only_processes_without_another_profile(
    tmp_path: Path,
    spawn: Spawn,
) -> None:
    profile = tmp_path / "profile"
    profile.mkdir()
    bare = spawn("--remote-debugging-port=45999")
    foreign = spawn("--remote-debugging-port=45999", f"--user-data-dir={tmp_path / 'other'}")

    report = self_check(profile, port=45999)

    assert [(f.pid, f.matched_by) for f in report.found] == [(bare.pid, "debugging-port")]
    assert [f.pid for f in report.ignored] == [foreign.pid]
    assert foreign.poll() is None


def test_the_recorded_pid_needs_the_recorded_start_time(tmp_path: Path, spawn: Spawn) -> None:
    profile = tmp_path / "profile"
    profile.mkdir()
    proc = spawn()
    created = psutil.Process(proc.pid).create_time()

    assert self_check(profile, pid=proc.pid, create_time=created - 100).found == []
    report = self_check(profile, pid=proc.pid, create_time=created)
    assert [(f.pid, f.matched_by) for f in report.found] == [(proc.pid, "recorded-pid")]


def test_stale_singletons_of_a_dead_owner_are_removed(tmp_path: Path) -> None:
    profile = tmp_path / "profile"
    pid = dead_pid()
    make_singletons(profile, f"{socket.gethostname()}-{pid}")
    assert singleton_owner(profile) == (socket.gethostname(), pid)
    assert not pid_alive(pid)

    report = self_check(profile)

    assert report.singleton_removed == ["SingletonCookie", "SingletonLock", "SingletonSocket"]
    assert singletons(profile) == []
    assert f"owner pid {pid} is dead" in report.summary()


def test_singletons_of_a_live_owner_are_kept(tmp_path: Path) -> None:
    profile = tmp_path / "profile"
    make_singletons(profile, f"{socket.gethostname()}-{os.getpid()}")

    report = self_check(profile)

    assert report.singleton_removed == []
    assert report.singleton_kept == ["SingletonCookie", "SingletonLock", "SingletonSocket"]
    assert len(singletons(profile)) == 3
    assert "is alive" in report.summary()


def test_singletons_of_another_host_are_kept(tmp_path: Path) -> None:
    profile = tmp_path / "profile"
    make_singletons(profile, f"not-{socket.gethostname()}-{dead_pid()}")
    report = self_check(profile)
    assert report.singleton_kept and not report.singleton_removed
    assert len(singletons(profile)) == 3
