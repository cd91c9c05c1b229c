"""The per-provider Retry-After gate.

When a provider answers 429/503 with Retry-After, that instruction holds for
the whole lane: every request to that provider, from any task, waits until
the time given. Requests are sent only through `RetryGate.wait`, so the one
gate per provider is the single place that enforces it.

A wait here is cut short by a cancel only when the caller awaits it through
`RunContext.guard` (the one cancel path).

Several hosts on one database share each provider's gate (`SharedGates`,
the store's `set_gate`/`get_gate`): a Retry-After one host received holds
every host back. The in-memory gate stays the fast path: a wait reads the
shared one at most every `SHARED_READ_S`, and a single host (SQLite) has no
shared gate at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Protocol

from dispatcher.clock import Clock
from dispatcher.errors import StoreError

log = logging.getLogger("apirunner")

# The provider's clock and ours are read at slightly different instants; a
# few milliseconds late costs nothing, a microsecond early breaks the promise.
GATE_SLACK_S = 0.005
# How stale this host's view of another host's Retry-After may be (real s):
# a read per request would be a database round trip per request.
SHARED_READ_S = 0.05


class SharedGates(Protocol):
    """The providers' gates in the database (epoch seconds): `Store.set_gate`/`get_gate`."""

    async def set_gate(self, provider: str, not_before: float) -> None: ...

    async def get_gate(self, provider: str) -> float: ...


class RetryGate:
    """No request to this provider before `not_before` (clock.monotonic, real s)."""

    def __init__(self, clock: Clock, shared: SharedGates | None = None, provider: str = "") -> None:
        self._clock = clock
        self._not_before = 0.0
        self._shared = shared
        self._provider = provider
        self._read_at = float("-inf")
        self._publishing: set[asyncio.Task[None]] = set()

    @property
    def remaining_s(self) -> float:
        return max(0.0, self._not_before - self._clock.monotonic())

    def defer(self, real_s: float) -> None:
        """The provider said: not before `real_s` seconds from now."""
        until = self._clock.monotonic() + max(0.0, real_s) + GATE_SLACK_S
        self._not_before = max(self._not_before, until)
        if self._shared is not None:
            # Told to every host; defer is called where no await may be.
            epoch = self._clock.now() + max(0.0, real_s) + GATE_SLACK_S
            job = asyncio.get_running_loop().create_task(self._publish(epoch))
            self._publishing.add(job)
            job.add_done_callback(self._publishing.discard)

    async def _publish(self, epoch: float) -> None:
        assert self._shared is not None
        try:
            await self._shared.set_gate(self._provider, epoch)
        except StoreError as exc:
            log.error("[api:%s] sharing the Retry-After failed: %s", self._provider, exc)

    async def _read_shared(self) -> None:
        """Take in a later Retry-After another host received."""
        if self._shared is None:
            return
        mono = self._clock.monotonic()
        if mono - self._read_at < SHARED_READ_S:
            return
        self._read_at = mono
        with contextlib.suppress(StoreError):
            epoch = await self._shared.get_gate(self._provider)
            wait_s = epoch - self._clock.now()
            if wait_s > 0:
                self._not_before = max(self._not_before, self._clock.monotonic() + wait_s)

    async def wait(self) -> float:
        """Return once the gate is open; real seconds waited."""
        # Read first: what it costs is a round trip, not a wait for the provider.
        await self._read_shared()
        start = self._clock.monotonic()
        # A loop, not one sleep: another task may push the gate further while
        # we slept, and that later instruction binds us too.
        while (remaining := self.remaining_s) > 0:
            # Real seconds whatever time_scale says: a provider's instruction.
            await self._clock.sleep(remaining / self._clock.time_scale)
        return self._clock.monotonic() - start
