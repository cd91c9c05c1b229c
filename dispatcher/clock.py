"""The one clock: every timestamp and every wait goes through it.

`time_scale` multiplies every internal duration (heartbeat, stale limit,
polling waits, retry delays, de-dup window, timeouts) so tests and benchmarks
run the real logic at a fraction of its wall-clock time.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    time_scale: float

    def now(self) -> float:
        """Wall-clock seconds since the epoch (stored in rows)."""

    def monotonic(self) -> float:
        """Seconds on a clock that never jumps (for measuring intervals)."""

    async def sleep(self, duration_s: float) -> None:
        """Sleep `duration_s` nominal seconds, i.e. duration_s * time_scale real ones."""

    def scaled(self, duration_s: float) -> float:
        """Nominal seconds to real seconds."""


class SystemClock:
    def __init__(self, time_scale: float = 1.0) -> None:
        if time_scale <= 0:
            raise ValueError("time_scale must be positive")
        self.time_scale = time_scale

    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def scaled(self, duration_s: float) -> float:
        return duration_s * self.time_scale

    async def sleep(self, duration_s: float) -> None:
        await asyncio.sleep(max(0.0, duration_s * self.time_scale))


class FakeClock:
    """A clock for unit tests: time moves only when the test says so."""

    def __init__(self, start: float = 1_700_000_000.0, time_scale: float = 1.0) -> None:
        self._now = start
        self._mono = 0.0
        self.time_scale = time_scale

    def now(self) -> float:
        return self._now

    def monotonic(self) -> float:
        return self._mono

    def scaled(self, duration_s: float) -> float:
        return duration_s * self.time_scale

    def advance(self, duration_s: float) -> None:
        self._now += duration_s
        self._mono += duration_s

    async def sleep(self, duration_s: float) -> None:
        self.advance(duration_s * self.time_scale)
        await asyncio.sleep(0)
