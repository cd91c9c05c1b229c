"""The per-provider Retry-After gate and cancel-aware waits."""

from __future__ import annotations

import asyncio
import time

import pytest

from apirunner.gate import GATE_SLACK_S, RetryGate, race_cancel, sleep_nominal
from dispatcher.clock import FakeClock, SystemClock
from dispatcher.errors import TaskCanceled


async def test_the_gate_holds_until_the_time_given_in_real_seconds() -> None:
    # time_scale must not shrink a provider's Retry-After.
    clock = FakeClock(time_scale=0.01)
    gate = RetryGate(clock)
    gate.defer(2.0)
    waited = await gate.wait(None)
    assert waited == pytest.approx(2.0 + GATE_SLACK_S)
    assert gate.remaining_s == 0.0


async def test_a_later_instruction_extends_the_gate_an_earlier_one_never_shortens_it() -> None:
    clock = FakeClock()
    gate = RetryGate(clock)
    gate.defer(5.0)
    gate.defer(1.0)
    assert gate.remaining_s == pytest.approx(5.0 + GATE_SLACK_S)


async def test_an_open_gate_costs_nothing() -> None:
    assert await RetryGate(FakeClock()).wait(None) == 0.0


async def test_all_waiters_of_one_provider_share_the_gate() -> None:
    clock = SystemClock()
    gate = RetryGate(clock)
    gate.defer(0.2)
    start = time.monotonic()
    await asyncio.gather(*(gate.wait(None) for _ in range(5)))
    assert time.monotonic() - start >= 0.2


async def test_cancel_wakes_a_long_wait_at_once() -> None:
    clock = SystemClock()
    cancel = asyncio.Event()
    gate = RetryGate(clock)
    gate.defer(30.0)
    asyncio.get_running_loop().call_later(0.05, cancel.set)
    start = time.monotonic()
    with pytest.raises(TaskCanceled):
        await gate.wait(cancel)
    assert time.monotonic() - start < 1.0


async def test_sleep_nominal_applies_time_scale_and_honours_cancel() -> None:
    clock = SystemClock(time_scale=0.01)
    start = time.monotonic()
    await sleep_nominal(clock, 5.0, None)
    assert 0.04 <= time.monotonic() - start < 1.0
    cancel = asyncio.Event()
    cancel.set()
    with pytest.raises(TaskCanceled):
        await sleep_nominal(clock, 5.0, cancel)


async def test_race_cancel_returns_the_result_or_cancels_the_work() -> None:
    cancel = asyncio.Event()

    async def answer() -> int:
        return 42

    assert await race_cancel(answer(), cancel) == 42
    finished = asyncio.Event()

    async def forever() -> None:
        try:
            await asyncio.sleep(60)
        finally:
            finished.set()

    asyncio.get_running_loop().call_later(0.02, cancel.set)
    with pytest.raises(TaskCanceled):
        await race_cancel(forever(), cancel)
    assert finished.is_set()  # the work was unwound, not left running


async def test_race_cancel_lets_other_cancellations_through() -> None:
    cancel = asyncio.Event()

    async def waiting() -> None:
        await race_cancel(asyncio.sleep(60), cancel)

    outer = asyncio.create_task(waiting())
    await asyncio.sleep(0.01)
    outer.cancel()  # a shutdown, not an operator's cancel: it must stay one
    with pytest.raises(asyncio.CancelledError):
        await outer
    # And an operator's cancel leaves the task free to go on afterwards.
    inner = asyncio.create_task(race_cancel(asyncio.sleep(60), cancel))
    asyncio.get_running_loop().call_later(0.01, cancel.set)
    with pytest.raises(TaskCanceled):
        await inner
    assert not inner.cancelled()


async def test_race_cancel_work_that_outlives_the_interrupt_keeps_its_result() -> None:
    cancel = asyncio.Event()

    async def stubborn() -> str:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            return "finished anyway"
        return "slept"

    asyncio.get_running_loop().call_later(0.01, cancel.set)
    assert await race_cancel(stubborn(), cancel) == "finished anyway"
    current = asyncio.current_task()
    assert current is not None and current.cancelling() == 0
    await asyncio.sleep(0)  # no stray cancellation left behind
