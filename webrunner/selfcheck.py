"""The psutil self-check run before every browser start of an account.

A dispatcher that was killed (or a task whose cleanup was interrupted) can
leave a Chromium running on the account's user-data dir. A second Chromium
started on that dir would not run: it hands its command line to the first
one over the profile's singleton socket and exits, so the task would end up
driving a stranger's window, or nothing. Hence, before each start: find what
is left of the account's browser, end it, and clear the profile's
``Singleton*`` files when whoever created them is gone.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

# A process that ignores SIGTERM this long is killed. Real seconds on purpose:
# it is the operating system's time, not a nominal duration of the model.
KILL_AFTER_S = 3.0

SINGLETON_PREFIX = "Singleton"
_SINGLETON_LOCK = "SingletonLock"

USER_DATA_DIR_FLAG = "--user-data-dir="
DEBUGGING_PORT_FLAG = "--remote-debugging-port="

# How often a wait for processes to die looks for zombies (see `wait_gone`).
_WAIT_SLICE_S = 0.05


@dataclass(frozen=True)
class FoundProcess:
    pid: int
    name: str
    matched_by: str  # "user-data-dir", "debugging-port" or "recorded-pid"
    cmdline: str

    def describe(self) -> str:
        return f"pid {self.pid} {self.name} (by {self.matched_by})"


@dataclass
class SelfCheckReport:
    user_data_dir: Path
    found: list[FoundProcess] = field(default_factory=list)
    terminated: list[int] = field(default_factory=list)  # exited after SIGTERM
    killed: list[int] = field(default_factory=list)  # needed SIGKILL
    survivors: list[int] = field(default_factory=list)  # still there after SIGKILL
    ignored: list[FoundProcess] = field(default_factory=list)  # port reused by someone else
    singleton_removed: list[str] = field(default_factory=list)
    singleton_kept: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        """True when nothing was left over (nothing ended, nothing removed)."""
        return not (self.found or self.singleton_removed or self.singleton_kept)

    @property
    def ok(self) -> bool:
        """True when the profile is free to be opened by a new browser."""
        return not self.survivors

    def summary(self) -> str:
        if self.clean and not self.ignored and not self.notes:
            return f"self-check of {self.user_data_dir}: nothing left over"
        parts = [f"self-check of {self.user_data_dir}:"]
        if self.found:
            parts.append(
                f"found {len(self.found)} leftover browser process(es) "
                f"[{', '.join(p.describe() for p in self.found)}]; "
                f"{len(self.terminated)} ended on SIGTERM, {len(self.killed)} killed"
            )
        if self.survivors:
            parts.append(f"STILL ALIVE after SIGKILL: {self.survivors}")
        if self.ignored:
            parts.append(
                "left alone (same debugging port, another profile): "
                + ", ".join(p.describe() for p in self.ignored)
            )
        if self.singleton_removed:
            parts.append(f"removed stale {', '.join(self.singleton_removed)}")
        if self.singleton_kept:
            parts.append(f"kept {', '.join(self.singleton_kept)}")
        parts.extend(self.notes)
        return " ".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {
            "user_data_dir": str(self.user_data_dir),
            "found": [p.describe() for p in self.found],
            "terminated": self.terminated,
            "killed": self.killed,
            "survivors": self.survivors,
            "ignored": [p.describe() for p in self.ignored],
            "singleton_removed": self.singleton_removed,
            "singleton_kept": self.singleton_kept,
            "notes": self.notes,
        }


def _is_gone(proc: psutil.Process) -> bool:
    # Our container's init does not reap orphans, so a dead browser child can
    # linger as a zombie: it holds no resources and counts as gone.
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
    except psutil.AccessDenied:
        return False


def pid_alive(pid: int) -> bool:
    try:
        return not _is_gone(psutil.Process(pid))
    except psutil.NoSuchProcess:
        return False


def _flag_value(cmdline: list[str], flag: str) -> str | None:
    for arg in cmdline:
        if arg.startswith(flag):
            return arg[len(flag) :]
    return None


def _same_dir(value: str, proc: psutil.Process, target: str) -> bool:
    if not os.path.isabs(value):
        try:
            value = os.path.join(proc.cwd(), value)
        except (psutil.Error, OSError):
            return False
    return os.path.realpath(value) == target


def find_leftovers(
    user_data_dir: Path,
    *,
    port: int | None = None,
    pid: int | None = None,
    create_time: float | None = None,
) -> tuple[list[tuple[psutil.Process, FoundProcess]], list[FoundProcess]]:
    """Processes of this profile's browser, and port matches that belong to others.

    A process matches by its ``--user-data-dir`` (resolved), by the debugging
    port the account's last browser used (unless it names another profile:
    the port may have been reused since), or by being the recorded browser
    PID with the recorded start time (a PID alone may have been reused).
    """
    target = os.path.realpath(user_data_dir)
    me = os.getpid()
    port_arg = f"{DEBUGGING_PORT_FLAG}{port}" if port else None
    found: list[tuple[psutil.Process, FoundProcess]] = []
    ignored: list[FoundProcess] = []
    for proc in psutil.process_iter(["pid", "name", "cmdline", "create_time"]):
        if proc.pid == me:
            continue
        cmdline: list[str] = proc.info.get("cmdline") or []
        name = proc.info.get("name") or "?"
        short = " ".join(cmdline)[:300]
        udd = _flag_value(cmdline, USER_DATA_DIR_FLAG)
        reason: str | None = None
        if udd is not None and _same_dir(udd, proc, target):
            reason = "user-data-dir"
        elif port_arg and port_arg in cmdline:
            if udd is None:
                reason = "debugging-port"
            else:
                ignored.append(FoundProcess(proc.pid, name, "debugging-port", short))
        elif (
            pid is not None
            and proc.pid == pid
            and create_time is not None
            and abs((proc.info.get("create_time") or 0.0) - create_time) < 0.5
        ):
            reason = "recorded-pid"
        if reason and not _is_gone(proc):
            found.append((proc, FoundProcess(proc.pid, name, reason, short)))
    return found, ignored


def _parent_pid(proc: psutil.Process) -> int | None:
    try:
        return int(proc.ppid())
    except psutil.Error:
        return None


def _with_descendants(procs: list[psutil.Process]) -> list[psutil.Process]:
    seen: dict[int, psutil.Process] = {}
    for proc in procs:
        seen.setdefault(proc.pid, proc)
        with contextlib.suppress(psutil.Error):
            for child in proc.children(recursive=True):
                seen.setdefault(child.pid, child)
    return list(seen.values())


def _signal_all(procs: list[psutil.Process], sig: signal.Signals) -> None:
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(sig)


def wait_gone(procs: list[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Wait (blocking, at most `timeout_s`) until every process is gone; those still alive.

    `psutil.wait_procs` wakes as soon as a process exits, but it waits for
    a non-child zombie as for a live process, so it is called in short
    slices between which zombies are counted as gone.
    """
    deadline = time.monotonic() + timeout_s
    alive = [p for p in procs if not _is_gone(p)]
    while alive:
        remaining_s = deadline - time.monotonic()
        if remaining_s <= 0:
            break
        slice_s = min(remaining_s, _WAIT_SLICE_S)
        # psutil would reap a child of ours, and its Popen would lose the
        # exit code: those are only looked at (a zombie counts as gone).
        strangers = [p for p in alive if _parent_pid(p) != os.getpid()]
        if strangers:
            psutil.wait_procs(strangers, timeout=slice_s)
        else:
            time.sleep(slice_s)
        alive = [p for p in alive if not _is_gone(p)]
    return alive


def end_processes(
    procs: list[psutil.Process], *, kill_after_s: float = KILL_AFTER_S
) -> tuple[list[int], list[int], list[int]]:
    """SIGTERM the processes and their descendants, SIGKILL what is left after a while.

    Returns (ended on SIGTERM, killed, survivors). Descendants are collected
    first because once a parent dies its children are reparented and no
    longer reachable through it.
    """
    everyone = _with_descendants(procs)
    main_pids = {p.pid for p in procs}
    # The browser process shuts its children down itself when asked nicely.
    _signal_all([p for p in everyone if p.pid in main_pids], signal.SIGTERM)
    alive = wait_gone(everyone, kill_after_s)
    if alive:
        _signal_all(alive, signal.SIGKILL)
    survivors = wait_gone(alive, 2.0)
    alive_pids = {p.pid for p in alive}
    terminated = [p.pid for p in everyone if p.pid in main_pids and p.pid not in alive_pids]
    killed = [p.pid for p in alive if p not in survivors]
    return terminated, killed, [p.pid for p in survivors]


def singleton_owner(user_data_dir: Path) -> tuple[str, int] | None:
    """(hostname, pid) from the SingletonLock symlink ("hostname-PID"), if any."""
    try:
        target = os.readlink(user_data_dir / _SINGLETON_LOCK)
    except OSError:
        return None
    host, _, pid = target.rpartition("-")
    if not host or not pid.isdigit():
        return None
    return host, int(pid)


def clean_singletons(user_data_dir: Path, report: SelfCheckReport) -> None:
    """Remove the Singleton* files when their owner is dead; keep them otherwise."""
    try:
        names = sorted(p.name for p in user_data_dir.iterdir() if p.name.startswith("Singleton"))
    except FileNotFoundError:
        return
    if not names:
        return
    owner = singleton_owner(user_data_dir)
    if owner is not None:
        host, pid = owner
        if host != socket.gethostname():
            report.singleton_kept.extend(names)
            report.notes.append(
                f"(the profile is locked by pid {pid} on host {host!r}, which cannot be checked "
                "from here)"
            )
            return
        if pid_alive(pid):
            report.singleton_kept.extend(names)
            report.notes.append(f"(their owner pid {pid} is alive)")
            return
        reason = f"owner pid {pid} is dead"
    else:
        reason = "no owner recorded"
    for name in names:
        path = user_data_dir / name
        try:
            path.unlink()
        except FileNotFoundError:
            continue
        except OSError as exc:
            report.notes.append(f"(could not remove {name}: {exc.strerror})")
            continue
        report.singleton_removed.append(name)
    if report.singleton_removed:
        report.notes.append(f"({reason})")


def self_check(
    user_data_dir: Path,
    *,
    port: int | None = None,
    pid: int | None = None,
    create_time: float | None = None,
    kill_after_s: float = KILL_AFTER_S,
) -> SelfCheckReport:
    """Find and end leftovers of this profile's browser, then clear stale singletons.

    Blocking (it may wait `kill_after_s`); async callers run it in a thread.
    """
    report = SelfCheckReport(user_data_dir=user_data_dir)
    matches, report.ignored = find_leftovers(
        user_data_dir, port=port, pid=pid, create_time=create_time
    )
    if matches:
        # Report and signal the roots only: a browser's zygote and renderers
        # carry the same flags, and they go when the browser process goes.
        pids = {proc.pid for proc, _ in matches}
        roots = [(proc, found) for proc, found in matches if _parent_pid(proc) not in pids]
        report.found = [found for _, found in roots]
        report.terminated, report.killed, report.survivors = end_processes(
            [proc for proc, _ in roots], kill_after_s=kill_after_s
        )
    clean_singletons(user_data_dir, report)
    return report
