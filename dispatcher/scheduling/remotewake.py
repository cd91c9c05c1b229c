"""When another host's new pending task wakes this host's scheduler.

Every host hears every task written anywhere (`hosts.crosshost`). A task
submitted to host A is claimed by A itself at once when A has a free slot
for it. A host that woke at the task's notice would make a claim that finds
nothing (the task is A's by then): three hosts at 30 tasks/s made 2.99
claims a task, two of them round trips for nothing (benchmark 6, issue 31).

So another host's pending task wakes this host only `GRACE_S` after it was
heard, and only if it was not heard leaving pending meanwhile (claimed by
any host, canceled). A task its own host cannot start now is claimed
elsewhere a grace later; the scheduler's tick (0.5 s) wakes every host
anyway. This host's own writes still wake it at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from dispatcher.clock import Clock

# Real seconds, not scaled by the time scale: the grace covers the time a
# host takes to claim its own insert (milliseconds when it has a slot), which
# a time scale does not shorten. A tenth of a second is late only for a task
# whose host was full, against runs of seconds.
GRACE_S = 0.1
# Pending tasks of other hosts kept at most (a job of 100,000 submitted
# elsewhere is 100,000 notices): past it, the oldest is dropped and the
# next check wakes the scheduler, as if it were due.
KEPT_MAX = 10_000


@dataclass(frozen=True, slots=True)
class WakeCheck:
    """What a check decided: wake the scheduler now, and when to look again."""

    wake: bool
    next_check_in_s: float | None  # None: nothing left to wait for


class RemotePending:
    """Other hosts' tasks heard pending and not yet heard leaving it."""

    def __init__(self, grace_s: float, kept_max: int = KEPT_MAX) -> None:
        self.grace_s = grace_s
        self.kept_max = kept_max
        # Task id -> when it was heard pending (a monotonic clock); in the
        # order heard, so the oldest come first.
        self._heard: dict[str, float] = {}
        self._overflowed = False
        self.heard = 0  # tasks heard pending (a notice of the task leaving
        # pending, read in the same batch, tells it in its new state alone)
        self.spared = 0  # tasks heard leaving pending before their grace ended

    def __len__(self) -> int:
        return len(self._heard)

    def heard_pending(self, task_id: str, now: float) -> bool:
        """Keeps the task; True when nothing was waiting before (a check is due
        `grace_s` from now)."""
        first = not self._heard and not self._overflowed
        if task_id not in self._heard:
            if len(self._heard) >= self.kept_max:
                del self._heard[next(iter(self._heard))]
                self._overflowed = True
            self._heard[task_id] = now
            self.heard += 1
        return first

    def left(self, task_id: str) -> None:
        """The task was heard in another state (any host's write, ours included)."""
        if self._heard.pop(task_id, None) is not None:
            self.spared += 1

    def check(self, now: float) -> WakeCheck:
        """Drops the tasks whose grace has ended: any of them still pending
        wakes the scheduler (its round claims whatever is first in line)."""
        wake, self._overflowed = self._overflowed, False
        while self._heard:
            task_id, heard_at = next(iter(self._heard.items()))
            waited_s = now - heard_at
            if waited_s < self.grace_s:
                return WakeCheck(wake, self.grace_s - waited_s)
            del self._heard[task_id]
            wake = True
        return WakeCheck(wake, None)


class RemoteWakes:
    """`RemotePending` on the event loop's timer: wakes the scheduler (`wake`)
    when a grace ends with another host's task still pending."""

    def __init__(self, clock: Clock, wake: Callable[[], None]) -> None:
        self.clock = clock
        self.wake = wake
        self.pending = RemotePending(GRACE_S)
        self._check: asyncio.TimerHandle | None = None
        self._closed = False

    def heard_pending(self, task_id: str) -> None:
        if self.pending.heard_pending(task_id, self.clock.monotonic()):
            self._arm(self.pending.grace_s)

    def left(self, task_id: str) -> None:
        self.pending.left(task_id)

    def close(self) -> None:
        self._closed = True
        if self._check is not None:
            self._check.cancel()
            self._check = None

    def _arm(self, delay_s: float) -> None:
        if self._check is None and not self._closed:
            self._check = asyncio.get_running_loop().call_later(delay_s, self._checked)

    def _checked(self) -> None:
        self._check = None
        check = self.pending.check(self.clock.monotonic())
        if check.wake:
            self.wake()
        if check.next_check_in_s is not None:
            self._arm(check.next_check_in_s)
