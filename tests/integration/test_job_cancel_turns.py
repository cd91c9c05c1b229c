"""Cancelling or retrying a big job leaves the service answering meanwhile.

SQLite writes run on the event loop's thread; a job-wide action of thousands
of writes that never gave the loop a turn froze everything else for its whole
length (the HTTP API, and the heartbeats of running attempts, which then went
stale: seen at 8-15 s for a 10,000-task job on a busy machine)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path

import pytest

from dispatcher.clock import FakeClock
from dispatcher.errors import PermanentError
from dispatcher.events import EventBus
from dispatcher.models import State
from dispatcher.store.sqlite import SqliteStore
from dispatcher.tasks.ledger import Ledger
from dispatcher.tasks.operator import JOB_WRITES_PER_TURN
from dispatcher.tasks.spec import TaskSpec
from tests.support.helpers import api_profile

TASKS = 2_000


@pytest.fixture
async def ledger(tmp_path: Path) -> AsyncIterator[Ledger]:
    store = SqliteStore(tmp_path / "d.db")
    await store.migrate()
    profile = api_profile()
    yield Ledger(store, FakeClock(), {profile.name: profile}, EventBus(), retry_delay_s=0.0)
    await store.close()


async def turns_given(action: Awaitable[object]) -> int:
    """How many times the loop ran something else while `action` ran."""
    turns = 0
    done = False

    async def ticker() -> None:
        nonlocal turns
        while not done:
            await asyncio.sleep(0)
            turns += 1

    tick = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    turns = 0
    await action
    done = True
    await tick
    return turns


async def test_a_job_cancel_gives_the_loop_turns(ledger: Ledger) -> None:
    specs = [TaskSpec("m-api", {"prompt": f"p{i}"}) for i in range(TASKS)]
    job, _ = await ledger.create_job("big", specs)
    turns = await turns_given(ledger.cancel_job(job.id))
    tasks = await ledger.store.job_tasks(job.id)
    assert [t.state for t in tasks] == [State.CANCELED] * TASKS
    # Before: none (the HTTP API and the heartbeats waited for the whole
    # cancel). Counted in turns, not seconds, so a busy machine cannot fail it.
    assert turns >= TASKS // JOB_WRITES_PER_TURN


async def test_a_job_retry_gives_the_loop_turns(ledger: Ledger) -> None:
    specs = [TaskSpec("m-api", {"prompt": f"p{i}"}) for i in range(TASKS // 4)]
    job, _ = await ledger.create_job("big", specs)
    while (task := await ledger.claim(["api-model:m-api"], "prov")) is not None:
        await ledger.fail(task, PermanentError("refused"))
    turns = await turns_given(ledger.retry_job(job.id))
    tasks = await ledger.store.job_tasks(job.id)
    assert [t.state for t in tasks] == [State.PENDING] * (TASKS // 4)
    assert turns >= TASKS // 4 // JOB_WRITES_PER_TURN
