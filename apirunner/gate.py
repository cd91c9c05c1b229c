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
from typing import Any, TypeVar

from dispatcher.clock import Clock
from dispatcher.errors import TaskCanceled

T = TypeVar("T")

# The provider's clock and ours are read at slightly different instants; a
# few milliseconds late costs nothing, a microsecond early breaks the promise.
GATE_SLACK_S = 0.005


async def race_cancel(work: Awaitable[T], cancel: asyncio.Event | None) -> T:
    """Await `work`, or raise TaskCanceled as soon as `cancel` is set."""
    if cancel is None:
        return await work
    if cancel.is_set():
        if asyncio.iscoroutine(work):
            work.close()  # never started: close it so Python does not warn
        raise TaskCanceled("canceled while waiting")
    job: asyncio.Future[T] = asyncio.ensure_future(work)
    waiter: asyncio.Future[Any] = asyncio.ensure_future(cancel.wait())
    both: set[asyncio.Future[Any]] = {job, waiter}
    try:
        await asyncio.wait(both, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
        if not job.done():
            job.cancel()
            # Wait for the request to unwind (its connection is released) but
            # never let that wait swallow our own cancellation.
            await asyncio.wait({job})
        await asyncio.wait({waiter})
    if job.cancelled() and cancel.is_set():
        raise TaskCanceled("canceled while waiting")
    return job.result()


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
