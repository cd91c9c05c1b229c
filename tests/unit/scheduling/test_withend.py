"""The lane's next claim sent with a run's end write (`scheduling.withend`).

The decision alone, then the scheduler over a SQLite store (whose
`finish_and_claim` writes the end, then claims, in one transaction), so
that the path a claimed task takes is exercised in process: it starts as a
refill's would, and is given back when the scheduler stops meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dispatcher.accounts.switches import AccountBook
from dispatcher.clock import FakeClock
from dispatcher.errors import StoreError
from dispatcher.events import EventBus
from dispatcher.models import Kind, State, Task
from dispatcher.scheduling.decisions import LaneSnapshot
from dispatcher.scheduling.lanes import LaneSpec
from dispatcher.scheduling.scheduler import Scheduler
from dispatcher.scheduling.withend import ClaimWithEnd, claim_with_end
from dispatcher.store.base import EndedAndClaimed, NextClaim, TaskWrite
from dispatcher.store.hosts import Fence, Quota
from dispatcher.store.sqlite import SqliteStore
from dispatcher.tasks.ledger import Ledger
from dispatcher.tasks.spec import TaskSpec
from dispatcher.testing import FakeRunner
from tests.support.helpers import api_profile

API = LaneSpec("api:prov-a", Kind.API, "prov-a", ("api-model:m-a",), ("m-a",), 2)
WEB = LaneSpec("web:acc", Kind.WEB, "acc", ("web-model:w",), ("w",), 1)


def _snapshot(lane: LaneSpec, running: int, *, enabled: bool = True, concurrency: int = 0) -> Any:
    return LaneSnapshot(lane.name, concurrency or lane.concurrency, enabled, running)


def _decide(lane: LaneSpec, snapshot: LaneSnapshot, **given: Any) -> ClaimWithEnd | None:
    args: dict[str, Any] = {"fence": None, "quota": None, "budgeted": False, "stopping": False}
    return claim_with_end(lane, snapshot, **(args | given))


def test_an_api_lane_sends_its_next_claim_with_the_end_of_a_run() -> None:
    quota = Quota("prov-a", 2)
    sent = _decide(API, _snapshot(API, running=2), quota=quota)
    assert sent == ClaimWithEnd(("api-model:m-a",), "prov-a", quota)
    assert not sent.sent and sent.claimed is None


@pytest.mark.parametrize(
    ("lane", "snapshot", "given"),
    [
        (WEB, _snapshot(WEB, running=1), {}),  # a web account: lease and allowance first
        (API, _snapshot(API, running=1), {"fence": Fence("prov-a", 1)}),
        (API, _snapshot(API, running=1), {"budgeted": True}),  # after_claim's path
        (API, _snapshot(API, running=1), {"stopping": True}),
        (API, _snapshot(API, running=1), {"failed": True}),  # a 429 may cool it down
        (API, _snapshot(API, running=1, enabled=False), {}),  # switched off, cooling down
        # Halved by a 429 storm meanwhile: 2 still running of 1 allowed.
        (API, _snapshot(API, running=3, concurrency=1), {}),
    ],
)
def test_no_claim_rides_where_the_refill_would_not_make_the_same_one(
    lane: LaneSpec, snapshot: LaneSnapshot, given: dict[str, Any]
) -> None:
    assert _decide(lane, snapshot, **given) is None


class PairingStore(SqliteStore):
    """SQLite's `finish_and_claim` (one transaction, as PostgreSQL's one
    round trip), held or failed at will; counting both kinds of claim."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.pairs = 0
        self.claims = 0
        self.hold: asyncio.Event | None = None  # set: the pair waits for it
        self.fail = False  # the pair fails, writing nothing (PostgreSQL's transaction)

    async def finish_and_claim(self, write: TaskWrite, claim: NextClaim) -> EndedAndClaimed | None:
        if self.hold is not None:
            await self.hold.wait()
        if self.fail:
            raise StoreError("PostgreSQL end and claim failed: the server went away")
        self.pairs += 1
        return await super().finish_and_claim(write, claim)

    async def claim_next(
        self, queues: Sequence[str], now: float, changes: Mapping[str, Any], **guards: Any
    ) -> Task | None:
        self.claims += 1
        return await super().claim_next(queues, now, changes, **guards)


@dataclass
class World:
    store: PairingStore
    ledger: Ledger
    scheduler: Scheduler
    runner: FakeRunner

    async def submit(self, prompt: str) -> Task:
        return (await self.ledger.submit(TaskSpec("m-a", {"prompt": prompt}))).task

    async def settle(self) -> None:
        for _ in range(30):
            await asyncio.sleep(0)


@contextlib.asynccontextmanager
async def _world(tmp_path: Path) -> AsyncIterator[World]:
    store = PairingStore(tmp_path / "d.db")
    await store.migrate()
    clock = FakeClock()
    events = EventBus()
    profiles = {"m-a": api_profile("m-a", "prov-a")}
    ledger = Ledger(store, clock, profiles, events, retry_delay_s=0.0)
    accounts = await AccountBook.load(store, clock, events)
    lane = LaneSpec("api:prov-a", Kind.API, "prov-a", ("api-model:m-a",), ("m-a",), 1)
    await accounts.ensure([(lane.owner, lane.kind)])
    runner = FakeRunner()
    scheduler = Scheduler(
        ledger=ledger,
        clock=clock,
        lanes={lane.name: lane},
        runners={Kind.API: runner},
        accounts=accounts,
        profiles=profiles,
        results_dir=tmp_path / "results",
    )
    try:
        yield World(store, ledger, scheduler, runner)
    finally:
        await scheduler.shutdown()
        await store.close()


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    async with _world(tmp_path) as made:
        yield made


async def test_the_task_claimed_with_the_end_starts_without_a_claim_of_its_own(
    world: World,
) -> None:
    tasks = [await world.submit(f"p{i}") for i in range(3)]
    await world.scheduler.round()
    await world.settle()
    assert world.runner.started == ["p0"] and world.store.claims == 1

    world.runner.finish("p0")
    await world.settle()
    assert world.runner.started == ["p0", "p1"]
    assert world.store.pairs == 1
    assert world.store.claims == 1  # the refill found the lane full: no claim sent
    assert (await world.ledger.get(tasks[0].id)).state is State.SUCCESS
    assert (await world.ledger.get(tasks[1].id)).state is State.RUNNING
    assert world.scheduler.lane_tasks("api:prov-a") == [tasks[1].id]

    # The last one: its end's claim finds nothing; the lane goes idle.
    world.runner.finish("p1")
    world.runner.finish("p2")
    await world.settle()
    assert world.runner.started == ["p0", "p1", "p2"]
    assert world.scheduler.lane_tasks("api:prov-a") == []
    assert [(await world.ledger.get(t.id)).state for t in tasks] == [State.SUCCESS] * 3


async def test_a_task_claimed_while_the_scheduler_stops_is_given_back(world: World) -> None:
    tasks = [await world.submit(f"p{i}") for i in range(2)]
    await world.scheduler.round()
    await world.settle()
    world.store.hold = asyncio.Event()
    world.runner.finish("p0")
    await world.settle()  # the end write (and its claim) in flight
    await world.scheduler.shutdown()
    world.store.hold.set()
    await world.settle()
    assert world.store.pairs == 1
    assert world.runner.started == ["p0"]
    assert (await world.ledger.get(tasks[0].id)).state is State.SUCCESS
    # Claimed with the end, then given back: pending again, same attempt.
    back = await world.ledger.get(tasks[1].id)
    assert back.state is State.PENDING and back.attempt == 1


async def test_a_failed_end_and_claim_ends_the_run_alone_and_the_refill_claims(
    world: World,
) -> None:
    tasks = [await world.submit(f"p{i}") for i in range(2)]
    await world.scheduler.round()
    await world.settle()
    world.store.fail = True
    world.runner.finish("p0")
    await world.settle()
    # The outcome is not lost to the claim's failure: written on its own,
    # and the freed slot claimed as before the pairing existed.
    assert (await world.ledger.get(tasks[0].id)).state is State.SUCCESS
    assert world.store.pairs == 0 and world.store.claims == 2
    assert world.runner.started == ["p0", "p1"]
