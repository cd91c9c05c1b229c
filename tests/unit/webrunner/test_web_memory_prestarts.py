"""Starts before any task (`prewarm.py`) under the browser memory budget.

Before any browser is measured on the host, each start in flight is counted
at a guess (`DEFAULT_BROWSER_BYTES`): twenty lanes opening at once found room
for fewer browsers than fit, and those left out never got one before their
first task. Such a start now waits for the others in flight to settle, and
is refused only once none is; a task's start in flight is never waited for
(its browser may generate for minutes before it is handed back).
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from webrunner.browser import BrowserSession, Log
from webrunner.keeper import BrowserKeeper
from webrunner.memory import DEFAULT_BROWSER_BYTES
from webrunner.memorygate import BrowserMemory

LOG = logging.getLogger("test.memory")
# Far beyond a measure of this process and a decision: a start that returns
# within it did not wait for a browser to settle.
DECIDED_S = 10.0


async def _close(session: BrowserSession, log: Log) -> None:
    raise AssertionError("nothing is open to close")


async def _gate() -> BrowserMemory:
    keeper = BrowserKeeper(("a", "b", "c"), keep_alive_s=600.0, close=_close)
    memory = BrowserMemory(keeper, budget_mb=1)
    service = (await memory.view()).service_bytes
    # Room for the service and one browser at the guess, not for two.
    memory.budget_bytes = service + DEFAULT_BROWSER_BYTES + DEFAULT_BROWSER_BYTES // 2
    return memory


@pytest.mark.asyncio
async def test_a_start_before_any_task_waits_for_another_in_flight_then_starts() -> None:
    memory = await _gate()
    assert await memory.make_room("a", LOG, for_task=False)
    second = asyncio.create_task(memory.make_room("b", LOG, for_task=False))
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(asyncio.shield(second), 0.3)
    # a's browser is kept (here it holds no process): measured, b fits.
    memory.settled("a")
    assert await asyncio.wait_for(second, DECIDED_S)


@pytest.mark.asyncio
async def test_a_start_before_any_task_does_not_wait_for_a_task_s_start() -> None:
    memory = await _gate()
    assert await memory.make_room("a", LOG)  # a task's start, still in flight
    assert not await asyncio.wait_for(memory.make_room("c", LOG, for_task=False), DECIDED_S)


@pytest.mark.asyncio
async def test_a_failed_start_in_flight_frees_the_waiting_one() -> None:
    memory = await _gate()
    assert await memory.make_room("a", LOG, for_task=False)
    second = asyncio.create_task(memory.make_room("b", LOG, for_task=False))
    await asyncio.sleep(0)
    memory.gone("a")  # its launch failed: the room it held is free
    assert await asyncio.wait_for(second, DECIDED_S)
