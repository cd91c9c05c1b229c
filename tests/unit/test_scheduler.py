"""The scheduler in process: a real SQLite store in a temp dir, a fake runner.

Rounds are driven by hand (`await scheduler.round()`), so each test says exactly
when the scheduler looks; the fake runner holds every run until the test
lets it finish.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dispatcher.accounts.switches import AccountBook
from dispatcher.clock import FakeClock
from dispatcher.errors import StateConflict
from dispatcher.events import Event, EventBus, TaskChanged
from dispatcher.models import Kind, Stage, State, Task
from dispatcher.scheduling.lanes import LaneSpec
from dispatcher.scheduling.protocol import RunContext, RunResult
from dispatcher.scheduling.scheduler import Scheduler
from dispatcher.store.sqlite import SqliteStore
from dispatcher.tasks.ledger import Ledger
from dispatcher.tasks.spec import TaskSpec
from dispatcher.testing import FakeRunner
from tests.support.helpers import api_profile


@dataclass
class World:
    ledger: Ledger
    scheduler: Scheduler
    runner: FakeRunner

    async def submit(self, model: str, prompt: str) -> Task:
        return (await self.ledger.submit(TaskSpec(model, {"prompt": prompt}))).task

    async def settle(self) -> None:
        """Let started runs reach their gate and finished ones write their outcome."""
        for _ in range(20):
            await asyncio.sleep(0)


def _lane(provider: str, model: str, concurrency: int) -> LaneSpec:
    return LaneSpec(
        name=f"api:{provider}",
        kind=Kind.API,
        owner=provider,
        queues=(f"api-model:{model}",),
        models=(model,),
        concurrency=concurrency,
    )


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    async with _world(tmp_path) as made:
        yield made


@contextlib.asynccontextmanager
async def _world(
    tmp_path: Path, time_scale: float = 1.0, *, beats_required: bool = False
) -> AsyncIterator[World]:
    store = SqliteStore(tmp_path / "d.db")
    await store.migrate()
    clock = FakeClock(time_scale=time_scale)
    events = EventBus()
    profiles = {p.name: p for p in (api_profile("m-a", "prov-a"), api_profile("m-b", "prov-b"))}
    ledger = Ledger(store, clock, profiles, events, retry_delay_s=0.0)
    accounts = await AccountBook.load(store, clock, events)
    lanes = {lane.name: lane for lane in (_lane("prov-a", "m-a", 1), _lane("prov-b", "m-b", 1))}
    await accounts.ensure((lane.owner, lane.kind) for lane in lanes.values())
    runner = FakeRunner(beats_required=beats_required)
    scheduler = Scheduler(
        ledger=ledger,
        clock=clock,
        lanes=lanes,
        runners={Kind.API: runner},
        accounts=accounts,
        profiles=profiles,
        results_dir=tmp_path / "results",
    )
    yield World(ledger, scheduler, runner)
    await scheduler.shutdown()
    await store.close()


async def test_a_lane_takes_its_oldest_task_first_and_refills_as_one_ends(world: World) -> None:
    tasks = [await world.submit("m-a", f"p{i}") for i in range(3)]
    await world.scheduler.round()
    await world.settle()
    assert world.runner.started == ["p0"]  # concurrency 1: one at a time, oldest first

    world.runner.finish("p0")
    await world.settle()
    # The freed slot took the next task without waiting for a round.
    assert world.runner.started == ["p0", "p1"]
    assert (await world.ledger.get(tasks[0].id)).state is State.SUCCESS
    assert (await world.ledger.get(tasks[2].id)).state is State.PENDING


async def test_lanes_are_independent(world: World) -> None:
    await world.submit("m-a", "slow")
    await world.submit("m-a", "queued behind slow")
    other = await world.submit("m-b", "other lane")
    await world.scheduler.round()
    await world.settle()
    assert sorted(world.runner.started) == ["other lane", "slow"]

    world.runner.finish("other lane")
    await world.settle()
    # The busy lane of m-a never held up m-b's lane.
    assert (await world.ledger.get(other.id)).state is State.SUCCESS
    assert world.runner.started.count("queued behind slow") == 0


async def test_a_cancel_reaches_the_running_task_through_the_ledger_alone(world: World) -> None:
    task = await world.submit("m-a", "to cancel")
    await world.scheduler.round()
    await world.settle()
    assert (await world.ledger.get(task.id)).state is State.RUNNING

    await world.ledger.request_cancel(task.id)  # no scheduler call: it hears the event
    await world.settle()
    assert (await world.ledger.get(task.id)).state is State.CANCELED


async def test_a_heartbeat_that_loses_its_cancel_does_not_hold_the_outcome(tmp_path: Path) -> None:
    # On Python 3.11 a cancel that meets `asyncio.wait_for` as its inner wait
    # completes is lost (psycopg_pool waits for a connection that way). The
    # heartbeat loop then carried on, the run's end waited on it for ever, and
    # the task stayed running with fresh heartbeats until the service stopped.
    async with _world(tmp_path, time_scale=0.001) as world:  # a beat every 15 ms
        ledger = world.ledger
        write_beats = ledger.heartbeats
        beating = asyncio.Event()

        async def heartbeats_losing_cancels(
            beats: Sequence[tuple[Task, Stage | None]],
        ) -> list[Task | None]:
            beating.set()
            # Waiting for a free database connection, which arrives in the
            # same turn as the cancel: the cancel is lost.
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(3600)
            return await write_beats(beats)

        ledger.heartbeats = heartbeats_losing_cancels  # type: ignore[method-assign]
        finished = asyncio.Event()

        def on_event(event: Event) -> None:
            if isinstance(event, TaskChanged) and event.task.state is State.SUCCESS:
                finished.set()

        ledger.events.listen(on_event)
        task = await world.submit("m-a", "beats")
        await world.scheduler.round()
        await asyncio.wait_for(beating.wait(), timeout=5)

        world.runner.finish("beats")
        await asyncio.wait_for(finished.wait(), timeout=5)
        assert (await ledger.get(task.id)).state is State.SUCCESS
        assert task.id not in world.scheduler.running


async def test_a_round_while_an_outcome_is_written_does_not_start_the_next_run(
    world: World,
) -> None:
    ledger = world.ledger
    write_success = ledger.succeed
    writing, written = asyncio.Event(), asyncio.Event()

    async def slow_succeed(*args: Any, **kwargs: Any) -> Task | None:
        writing.set()
        await written.wait()  # a round trip to PostgreSQL, say
        return await write_success(*args, **kwargs)

    ledger.succeed = slow_succeed  # type: ignore[method-assign]
    first = await world.submit("m-a", "first")
    queued = await world.submit("m-a", "second")
    await world.scheduler.round()
    await world.settle()
    world.runner.finish("first")
    await asyncio.wait_for(writing.wait(), timeout=5)

    await world.scheduler.round()  # the slot is not free until the outcome is on record
    await world.settle()
    assert world.runner.started == ["first"]

    written.set()
    await world.settle()
    assert world.runner.started == ["first", "second"]
    done = await ledger.get(first.id)
    second = await ledger.get(queued.id)
    assert done.finished_at is not None and second.started_at is not None
    assert done.finished_at <= second.started_at


async def test_a_run_that_loses_the_shutdowns_cancel_does_not_hold_up_the_shutdown(
    world: World,
) -> None:
    # The shutdown's cancel meets `asyncio.wait_for` as its inner wait
    # completes (Python 3.11 loses it there; see dispatcher.background): the
    # run must end anyway, and its task go back to the queue, rather than the
    # shutdown waiting for the run's next natural end.
    inner: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    waiting = asyncio.Event()

    async def run(task: Task, ctx: RunContext) -> RunResult:
        waiting.set()
        await ctx.guard(asyncio.wait_for(inner, timeout=3600))
        await ctx.guard(asyncio.sleep(3600))  # a long poll
        return RunResult(text="never")

    world.runner.run = run  # type: ignore[method-assign]
    task = await world.submit("m-a", "long")
    await world.scheduler.round()
    await asyncio.wait_for(waiting.wait(), timeout=5)
    inner.set_result("connection")
    await asyncio.wait_for(world.scheduler.shutdown(), timeout=5)
    assert (await world.ledger.get(task.id)).state is State.PENDING


async def test_finished_tasks_leave_nothing_behind_in_the_scheduler(world: World) -> None:
    # A service drains tens of thousands of tasks between restarts (issue 14's
    # memory benchmark): whatever it keeps per task must go when the task ends.
    prompts = [f"p{i}" for i in range(30)]
    for prompt in prompts:
        world.runner.finish(prompt)
        await world.submit("m-a" if len(prompt) % 2 else "m-b", prompt)
    for _ in range(len(prompts)):
        await world.scheduler.round()
        await world.settle()
    tasks = await world.ledger.store.list_tasks(limit=100)
    assert [t.state for t in tasks] == [State.SUCCESS] * len(prompts)
    scheduler = world.scheduler
    assert scheduler.running == {}
    assert all(not scheduler.lane_tasks(name) for name in scheduler.lanes)
    assert len(scheduler.run_history) <= 2  # one shape per model, not one per task


async def test_a_remote_id_reported_after_a_reclaim_is_a_state_conflict(world: World) -> None:
    """A run whose task was reclaimed (no longer registered) that reports its
    remote id is told the task moved on, as the ledger tells it when the write
    is refused; it used to raise KeyError inside the run."""
    with pytest.raises(StateConflict, match="reclaimed before its remote id was stored"):
        await world.scheduler._record_remote_id("no-such-running-task", "remote-1")
