"""Waiting: the per-provider Retry-After gate and cancel-aware sleeps.

When a provider answers 429/503 with Retry-After, that instruction holds for
the whole lane: every request to that provider, from any task, waits until
the time given. Requests are sent only through `RetryGate.wait`, so the one
gate per provider is the single place that enforces it.

Every wait here races the task's cancel event, so a cancel is noticed at
once rather than at the end of a 15 s poll wait.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from dispatcher.clock import Clock
from dispatcher.errors import TaskCanceled

T = TypeVar("T")

# The provider's clock and ours are read at slightly different instants; a
# few milliseconds late costs nothing, a microsecond early breaks the promise.
GATE_SLACK_S = 0.005


async def race_cancel(work: Awaitable[T], cancel: asyncio.Event | None) -> T:
    """Await `work`, or raise TaskCanceled as soon as `cancel` is set.

    The work runs in the calling task itself: giving it a task of its own cost
    two turns of the event loop per request (one to start it, one to come
    back), and a turn is long while the service answers a burst of requests.
    A watcher on the event interrupts the calling task instead; the
    interruption is told from any other cancellation (a shutdown, which must
    still propagate) by the task's count of cancel requests.
    """
    if cancel is None:
        return await work
    if cancel.is_set():
        if asyncio.iscoroutine(work):
            work.close()  # never started: close it so Python does not warn
        raise TaskCanceled("canceled while waiting")
    task = asyncio.current_task()
    if task is None:
        raise RuntimeError("race_cancel must run inside a task")
    running = True
    interrupted = False

    def interrupt(_: object) -> None:
        nonlocal interrupted
        # `running`: the callback may already be queued when the work ends.
        if running and cancel.is_set():
            interrupted = True
            task.cancel()

    watcher = asyncio.ensure_future(cancel.wait())
    watcher.add_done_callback(interrupt)
    try:
        return await work
    except asyncio.CancelledError:
        if interrupted:
            interrupted = False
            if task.uncancel() == 0:  # ours alone: the work was unwound
                raise TaskCanceled("canceled while waiting") from None
        raise
    finally:
        running = False
        watcher.remove_done_callback(interrupt)
        watcher.cancel()
        if interrupted:
            task.uncancel()  # the work swallowed our interrupt and ended anyway


async def sleep_nominal(clock: Clock, nominal_s: float, cancel: asyncio.Event | None) -> None:
    """Sleep nominal seconds (time_scale applies), waking at once on cancel."""
    if nominal_s <= 0:
        if cancel is not None and cancel.is_set():
            raise TaskCanceled("canceled while waiting")
        return
    await race_cancel(clock.sleep(nominal_s), cancel)


async def sleep_real(clock: Clock, real_s: float, cancel: asyncio.Event | None) -> None:
    """Sleep real seconds whatever time_scale says (a provider's instruction)."""
    await sleep_nominal(clock, real_s / clock.time_scale, cancel)


class RetryGate:
    """No request to this provider before `not_before` (clock.monotonic, real s)."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._not_before = 0.0

    @property
    def remaining_s(self) -> float:
        return max(0.0, self._not_before - self._clock.monotonic())

    def defer(self, real_s: float) -> None:
        """The provider said: not before `real_s` seconds from now."""
        until = self._clock.monotonic() + max(0.0, real_s) + GATE_SLACK_S
        self._not_before = max(self._not_before, until)

    async def wait(self, cancel: asyncio.Event | None) -> float:
        """Return once the gate is open; real seconds waited."""
        start = self._clock.monotonic()
        # A loop, not one sleep: another task may push the gate further while
        # we slept, and that later instruction binds us too.
        while (remaining := self.remaining_s) > 0:
            await sleep_real(self._clock, remaining, cancel)
        return self._clock.monotonic() - start
