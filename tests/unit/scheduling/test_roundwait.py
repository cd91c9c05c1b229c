"""Waiting for the scheduler's next round (`roundwait.py`)."""

from __future__ import annotations

import asyncio

from dispatcher.scheduling.roundwait import RoundWaiters


async def test_a_waiter_goes_on_when_a_round_begun_after_it_ends() -> None:
    waiters = RoundWaiters()
    waiters.begin()  # a round under way when the caller asks: not the one
    waiting = asyncio.create_task(waiters.next_round(timeout_s=5))
    await asyncio.sleep(0)
    waiters.ended()
    await asyncio.sleep(0)
    assert not waiting.done()
    waiters.begin()
    await asyncio.sleep(0)
    assert not waiting.done()
    waiters.ended()
    assert await waiting is True


async def test_a_waiter_gives_up_after_its_timeout() -> None:
    waiters = RoundWaiters()
    assert await waiters.next_round(timeout_s=0.01) is False
    # A round ending later does not trip over the waiter that gave up.
    waiters.begin()
    waiters.ended()
