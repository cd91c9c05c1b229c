"""Ending an account's Chromium for good: its tree killed, its profile swept.

Owns the record of the last browser launched on a profile (`BrowserRecord`,
which the next start's self-check reads), the kill of a browser with its
children and process group (`kill_tree`), and the sweep of whatever else still
runs on the profile (`sweep_profile`). The kill blocks, so it runs in a thread:
the event loop (every other lane) goes on meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from webrunner.selfcheck import find_leftovers, wait_gone

# How long a kill may take to show (an exiting Chromium unmaps a lot of memory).
SWEEP_S = 5.0
SWEEP_CONFIRM_S = 0.05
# How long a SIGKILLed browser (and each known child) may take to be gone
# before the sweep looks for what is left.
KILL_WAIT_S = 2.0


@dataclass(frozen=True)
class BrowserRecord:
    """What the last browser of a profile was, kept next to it for the self-check."""

    pid: int
    port: int  # 0: none (the pipe); a record from before the pipe may name one
    create_time: float

    @staticmethod
    def path_for(user_data_dir: Path) -> Path:
        return user_data_dir.parent / f"{user_data_dir.name}.browser.json"

    @classmethod
    def load(cls, user_data_dir: Path) -> BrowserRecord | None:
        try:
            raw = json.loads(cls.path_for(user_data_dir).read_text(encoding="utf-8"))
            return cls(int(raw["pid"]), int(raw["port"]), float(raw["create_time"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def save(self, user_data_dir: Path) -> None:
        with contextlib.suppress(OSError):
            self.path_for(user_data_dir).write_text(
                json.dumps({"pid": self.pid, "port": self.port, "create_time": self.create_time}),
                encoding="utf-8",
            )

    @classmethod
    def clear(cls, user_data_dir: Path) -> None:
        with contextlib.suppress(OSError):
            cls.path_for(user_data_dir).unlink()


def family_of(process: subprocess.Popen[bytes]) -> list[psutil.Process]:
    """The browser process and its descendants, while it is ours to name."""
    if process.returncode is not None:  # once reaped, its PID may be someone else's
        return []
    try:
        main = psutil.Process(process.pid)
        return [main, *main.children(recursive=True)]
    except psutil.Error:
        return []


def sweep_profile(user_data_dir: Path, port: int | None) -> list[int]:
    """Kill anything still running on this profile; the PIDs that would not die.

    Catches children that escaped the browser's process group, and one
    forked by a zygote while we were killing it (hence a few rounds).
    Blocking: runs in a thread.
    """
    deadline = time.monotonic() + SWEEP_S
    alive: list[psutil.Process] = []
    seen_empty = False
    while time.monotonic() < deadline:
        matches, _ = find_leftovers(user_data_dir, port=port)
        alive = [proc for proc, _found in matches]
        if not matches:
            # One empty look may have raced a fork (a process table walk
            # passes a new low PID once PIDs wrap): clean means twice in a row.
            if seen_empty:
                break
            seen_empty = True
            time.sleep(SWEEP_CONFIRM_S)
            continue
        seen_empty = False
        for proc in alive:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        alive = wait_gone(alive, deadline - time.monotonic())
    BrowserRecord.clear(user_data_dir)
    return [p.pid for p in alive]


def _kill_tree_blocking(
    process: subprocess.Popen[bytes],
    user_data_dir: Path,
    port: int | None,
    family: list[psutil.Process],
) -> list[int]:
    unreaped = process.returncode is None
    # Until we reap it, the browser's PID (= its process group ID) cannot be
    # reused, so the group is surely ours to kill.
    everyone = {p.pid: p for p in [*family, *family_of(process)]}
    for proc in everyone.values():
        with contextlib.suppress(psutil.Error):
            proc.kill()
    if unreaped:
        with contextlib.suppress(OSError):
            # Children reparented after an earlier death are still in the group.
            os.killpg(process.pid, signal.SIGKILL)
    # The browser itself is reaped through Popen (psutil would reap it too,
    # and its exit code, which the logs show, would be lost).
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=KILL_WAIT_S)
    everyone.pop(process.pid, None)
    # Processes known before the kill, even once their command lines are
    # blank, then anything else on the profile.
    stragglers = wait_gone(list(everyone.values()), KILL_WAIT_S)
    survivors = {p.pid for p in stragglers} | set(sweep_profile(user_data_dir, port))
    if process.poll() is None:
        survivors.add(process.pid)
    return sorted(survivors)


async def kill_tree(
    process: subprocess.Popen[bytes],
    user_data_dir: Path,
    port: int | None,
    family: list[psutil.Process] | None = None,
) -> list[int]:
    """SIGKILL a browser, its children, its process group and whatever else runs
    on its profile; return once all of it is confirmed dead.

    Returns the PIDs that survived SIGKILL (never seen in practice). The
    waiting happens in a thread, so the event loop (every other lane) goes
    on meanwhile; bounded by KILL_WAIT_S and SWEEP_S. A cancel, even a
    second one during a cancelled task's cleanup, does not cut it short: the
    kill runs to its end, then the cancel is passed on.
    """
    work = asyncio.ensure_future(
        asyncio.to_thread(_kill_tree_blocking, process, user_data_dir, port, family or [])
    )
    cancelled = False
    while not work.done():
        try:
            await asyncio.shield(work)
        except asyncio.CancelledError:
            cancelled = True
    survivors = work.result()
    if cancelled:
        raise asyncio.CancelledError
    return survivors
