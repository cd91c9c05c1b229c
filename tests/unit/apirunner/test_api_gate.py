"""The per-provider Retry-After gate (its waits end on a cancel through `RunContext.guard`)."""

from __future__ import annotations

import asyncio
import time

import pytest

from apirunner.gate import GATE_SLACK_S, RetryGate
from dispatcher.clock import FakeClock, SystemClock


async def test_the_gate_holds_until_the_time_given_in_real_seconds() -> None:
    # time_scale must not shrink a provider's Retry-After.
    clock = FakeClock(time_scale=0.01)
    gate = RetryGate(clock)
    gate.defer(2.0)
    waited = await gate.wait()
    assert waited == pytest.approx(2.0 + GATE_SLACK_S)
    assert gate.remaining_s == 0.0


async def test_a_later_instruction_extends_the_gate_an_earlier_one_never_shortens_it() -> None:
    clock = FakeClock()
    gate = RetryGate(clock)
    gate.defer(5.0)
    gate.defer(1.0)
    assert gate.remaining_s == pytest.approx(5.0 + GATE_SLACK_S)


async def test_an_open_gate_costs_nothing() -> None:
    assert await RetryGate(FakeClock()).wait() == 0.0


async def test_all_waiters_of_one_provider_share_the_gate() -> None:
    clock = SystemClock()
    gate = RetryGate(clock)
    gate.defer(0.2)
    start = time.monotonic()
    await asyncio.gather(*(gate.wait() for _ in range(5)))
    assert time.monotonic() - start >= 0.2
