"""The per-provider Retry-After gate.

When a provider answers 429/503 with Retry-After, that instruction holds for
the whole lane: every request to that provider, from any task, waits until
the time given. Requests are sent only through `RetryGate.wait`, so the one
gate per provider is the single place that enforces it.

A wait here is cut short by a cancel only when the caller awaits it through
`RunContext.guard` (the one cancel path).
"""

from __future__ import annotations

from dispatcher.clock import Clock

# The provider's clock and ours are read at slightly different instants; a
# few milliseconds late costs nothing, a microsecond early breaks the promise.
GATE_SLACK_S = 0.005


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

    async def wait(self) -> float:
        """Return once the gate is open; real seconds waited."""
        start = self._clock.monotonic()
        # A loop, not one sleep: another task may push the gate further while
        # we slept, and that later instruction binds us too.
        while (remaining := self.remaining_s) > 0:
            # Real seconds whatever time_scale says: a provider's instruction.
            await self._clock.sleep(remaining / self._clock.time_scale)
        return self._clock.monotonic() - start
