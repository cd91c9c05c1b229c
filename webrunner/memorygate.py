"""The browser memory budget at work: measuring the browsers, and the gate
every browser start passes (`BrowserMemory.make_room`).

A start for a task asks for room under one lock (so that two starts never
both count the same free memory): the service's processes and each open
browser's process tree are measured (PSS, cached for `MEASURE_TTL_S`: reading
a Chromium's smaps costs ~4 ms a process, ~40 ms a browser), `memory.plan_room`
decides, the idle browsers it names are closed through the keeper (each under
its account's lock, taken only if free: a browser a task has just picked up
is never closed), and the start is counted at the size of a kept browser
until its own footprint is known (kept after its first task, or gone). When
only running browsers could make room, the start waits for a browser to be
handed back (`settled`) or gone, re-checking every `WAIT_POLL_S`.

A start before an account's first task (`prewarm.py`) closes nothing: while
other such starts are in flight (their size still a guess) it waits for
them, and once none is it is skipped when there is no room; the task starts
the browser later, under the rule above.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass

import psutil

from dispatcher.scheduling.protocol import MemoryView
from webrunner.browser import Log
from webrunner.browserkill import family_of
from webrunner.keeper import BrowserKeeper
from webrunner.memory import MB, OpenBrowser, Room, new_browser_bytes, plan_room

# Real seconds a process's measured footprint is reused by a start's decision,
# and by what operators read (`/metrics`, the lanes, which the dashboard
# fetches on every event: with twenty browsers a fresh read costs ~1 s of CPU).
MEASURE_TTL_S = 5.0
VIEW_TTL_S = 30.0
# Real seconds between two looks of a start waiting for room (it is woken at
# once when a browser is handed back or closed).
WAIT_POLL_S = 1.0


def _pss(proc: psutil.Process) -> int:
    """A process's PSS; its RSS where smaps cannot be read (then it counts more, not less)."""
    try:
        return int(proc.memory_full_info().pss)
    except psutil.AccessDenied:
        return int(proc.memory_info().rss)


class _Meter:
    """PSS of processes, each read at most once per `MEASURE_TTL_S`."""

    def __init__(self) -> None:
        # (pid, create time) -> (bytes, when measured: monotonic)
        self._cache: dict[tuple[int, float], tuple[int, float]] = {}
        # A scrape and a start may measure at once, each in its own thread.
        self._lock = threading.Lock()

    def total(self, procs: Iterable[psutil.Process], max_age_s: float) -> int:
        total = 0
        for proc in procs:
            try:
                key = (proc.pid, proc.create_time())
                with self._lock:
                    found = self._cache.get(key)
                now = time.monotonic()
                if found is None or now - found[1] > max_age_s:
                    found = (_pss(proc), now)
                    with self._lock:
                        self._cache[key] = found
            except psutil.Error:
                continue  # gone meanwhile: it holds nothing any more
            total += found[0]
        return total

    def forget_older_than(self, age_s: float) -> None:
        """Drops the measurements older than `age_s` (0: all; the next read measures afresh)."""
        now = time.monotonic()
        with self._lock:
            self._cache = {k: v for k, v in self._cache.items() if now - v[1] <= age_s}


@dataclass(frozen=True)
class _Measured:
    service_bytes: int
    browsers: dict[str, int]  # account -> its tree's PSS


class BrowserMemory:
    """The budget of one host's browsers (`browser_memory_mb`), kept at every start."""

    def __init__(self, keeper: BrowserKeeper, budget_mb: int) -> None:
        self.keeper = keeper
        self.budget_bytes = budget_mb * MB
        self.closed_for_room = 0  # idle browsers closed to make room (a counter)
        # How old a measurement a start's decision may reuse (real seconds).
        self.measure_ttl_s = MEASURE_TTL_S
        self._meter = _Meter()
        self._lock = asyncio.Lock()
        # Starts counted before their browser's own footprint is known: account -> bytes.
        self._reserved: dict[str, int] = {}
        # Of those, the starts before any task (`make_room(for_task=False)`).
        self._early: set[str] = set()
        self._largest_seen = 0
        self._changed = asyncio.Event()
        keeper.watcher = self

    # -- from the keeper --------------------------------------------------------

    def settled(self, account: str) -> None:
        """The account's browser was handed back (kept, idle): measure it from now on."""
        self._reserved.pop(account, None)
        self._early.discard(account)
        self._wake()

    def gone(self, account: str) -> None:
        """The account's browser is closed, or its start failed."""
        self._reserved.pop(account, None)
        self._early.discard(account)
        self._wake()

    def forget_measurements(self) -> None:
        """The next look measures every process afresh."""
        self._meter.forget_older_than(0.0)

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    # -- measuring --------------------------------------------------------------

    def _measure_blocking(
        self, processes: dict[str, subprocess.Popen[bytes]], max_age_s: float
    ) -> _Measured:
        trees = {account: family_of(process) for account, process in processes.items()}
        in_browsers = {p.pid for tree in trees.values() for p in tree}
        try:
            me = psutil.Process(os.getpid())
            service = [me, *(p for p in me.children(recursive=True) if p.pid not in in_browsers)]
        except psutil.Error:
            service = []
        measured = _Measured(
            self._meter.total(service, max_age_s),
            {account: self._meter.total(tree, max_age_s) for account, tree in trees.items()},
        )
        # Kept while a look may still reuse them (a start's age may be set longer).
        self._meter.forget_older_than(2 * max(VIEW_TTL_S, self.measure_ttl_s))
        return measured

    async def _measure(self, max_age_s: float) -> _Measured:
        processes = self.keeper.open_processes()
        measured = await asyncio.to_thread(self._measure_blocking, processes, max_age_s)
        # Only settled browsers (kept after a task, on their page) tell a typical size.
        settled = [b for a, b in measured.browsers.items() if a not in self._reserved]
        self._largest_seen = max([self._largest_seen, *settled])
        return measured

    async def view(self) -> MemoryView:
        """The budget and what each open browser and the service hold now."""
        measured = await self._measure(VIEW_TTL_S)
        return MemoryView(
            budget_bytes=self.budget_bytes,
            service_bytes=measured.service_bytes,
            browsers=dict(sorted(measured.browsers.items())),
        )

    # -- the gate ------------------------------------------------------------------

    def _plan(self, account: str, measured: _Measured) -> tuple[Room, int]:
        settled = [b for a, b in measured.browsers.items() if a not in self._reserved]
        new_bytes = new_browser_bytes(settled, self._largest_seen)
        browsers = [
            OpenBrowser(
                account=name,
                # A young browser has not loaded its page yet: counted as a kept one.
                bytes=max(size, self._reserved.get(name, 0)),
                busy=self.keeper.busy(name),
                idle_since=self.keeper.idle_since(name),
            )
            for name, size in measured.browsers.items()
            if name != account
        ]
        starting = sum(
            b for a, b in self._reserved.items() if a != account and a not in measured.browsers
        )
        room = plan_room(
            browsers,
            service_bytes=measured.service_bytes,
            starting_bytes=starting,
            new_bytes=new_bytes,
            budget_bytes=self.budget_bytes,
        )
        return room, new_bytes

    async def make_room(self, account: str, log: Log, *, for_task: bool = True) -> bool:
        """Room for the account's new browser within the budget: True once it
        may start (counted from now on). For a task, idle browsers are closed
        first if needed, and it waits while only running ones could make room
        (a cancel ends the wait). For a start before any task (`for_task`
        False): nothing is closed; while other such starts are in flight it
        waits for them (a young browser is counted as the largest kept one,
        or `DEFAULT_BROWSER_BYTES` before any is: twenty lanes opening at
        once would find room for fewer than fit), and False once none is and
        there is still no room. A task's start is never waited for here: its
        browser may run a generation for minutes before it settles."""
        said_waiting = False
        while True:
            changed = self._changed
            async with self._lock:
                measured = await self._measure(self.measure_ttl_s)
                room, new_bytes = self._plan(account, measured)
                if room.start and not (room.close and not for_task):
                    if room.close:
                        await self._close(room.close, account, measured, log)
                        continue  # measured again: the freed memory is counted out
                    self._reserved[account] = new_bytes
                    if not for_task:
                        self._early.add(account)
                    if room.alone and room.counted_bytes > self.budget_bytes:
                        log.warning(
                            "browser memory budget %d MB is below one browser (~%d MB with "
                            "the service's %d MB): one browser at a time",
                            self.budget_bytes // MB,
                            room.counted_bytes // MB,
                            measured.service_bytes // MB,
                        )
                    return True
            if not for_task:
                if not any(other != account for other in self._early):
                    return False
                # Settling (or failing), each in-flight start wakes this wait.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), WAIT_POLL_S)
                continue
            if not said_waiting:
                said_waiting = True
                log.info(
                    "waiting for browser memory: %d MB would be held, over the budget of %d MB, "
                    "and only running browsers could make room",
                    room.counted_bytes // MB,
                    self.budget_bytes // MB,
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), WAIT_POLL_S)

    async def _close(
        self, accounts: tuple[str, ...], starting: str, measured: _Measured, log: Log
    ) -> None:
        for name in accounts:
            held_mb = measured.browsers.get(name, 0) // MB
            closed = await self.keeper.evict(
                name,
                f"to make room for {starting}'s browser within the browser memory budget "
                f"({self.budget_bytes // MB} MB; it held {held_mb} MB)",
            )
            if closed:
                self.closed_for_room += 1
                log.info("closed the idle browser of %s to make room within the budget", name)
