"""Stopping background tasks, also those that lose a cancel (dispatcher.background)."""

from __future__ import annotations

import asyncio

import pytest

from dispatcher.background import stop_background


async def _loop_losing_cancels(ticks: list[int]) -> None:
    """A loop whose first cancel is lost, as a library's wait_for can lose one on Python 3.11."""
    while True:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            if ticks:
                raise
            ticks.append(1)  # lost: the loop goes on


async def test_a_background_task_that_loses_a_cancel_is_cancelled_again_until_it_ends() -> None:
    ticks: list[int] = []
    work = asyncio.create_task(_loop_losing_cancels(ticks))
    await asyncio.sleep(0)
    await asyncio.wait_for(stop_background(work), timeout=5)
    assert work.cancelled()
    assert ticks  # it did swallow one


async def test_the_lost_cancel_of_wait_for_is_caught() -> None:
    # The real shape: a waiter on a condition with wait_for (psycopg_pool's
    # wait for a connection), notified in the turn its cancel arrives.
    cond = asyncio.Condition()
    turns: list[str] = []

    async def waiter() -> None:
        while True:
            async with cond:
                await asyncio.wait_for(cond.wait(), timeout=3600)
            turns.append("woken")
            await asyncio.sleep(0.01)

    work = asyncio.create_task(waiter())
    await asyncio.sleep(0.01)
    async with cond:
        cond.notify_all()
    await asyncio.sleep(0)
    await asyncio.wait_for(stop_background(work), timeout=5)
    assert work.done()


async def test_a_failed_background_task_raises_its_error_and_a_finished_one_nothing() -> None:
    async def fails() -> None:
        raise ValueError("broken")

    failed = asyncio.create_task(fails())
    await asyncio.sleep(0)
    with pytest.raises(ValueError, match="broken"):
        await stop_background(failed)
    done = asyncio.create_task(asyncio.sleep(0))
    await done
    await stop_background(done)


async def test_the_callers_own_cancel_is_not_swallowed() -> None:
    ticks: list[int] = []
    work = asyncio.create_task(_loop_losing_cancels(ticks))
    await asyncio.sleep(0)

    async def stopper() -> None:
        # Swallows every cancel for a while: stop_background keeps waiting on it.
        await stop_background(work)

    outer = asyncio.create_task(stopper())
    await asyncio.sleep(0)
    outer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await outer
    await stop_background(work)
