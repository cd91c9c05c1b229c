"""The scheduler's look for stale running tasks: every `STALE_LOOK_S` (scaled),
not every round (a query each on PostgreSQL)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dispatcher.accounts.switches import AccountBook
from dispatcher.clock import FakeClock
from dispatcher.events import EventBus
from dispatcher.models import Kind, Task
from dispatcher.scheduling.lanes import LaneSpec
from dispatcher.scheduling.scheduler import STALE_LOOK_S, Scheduler
from dispatcher.store.sqlite import SqliteStore
from dispatcher.tasks.ledger import Ledger
from dispatcher.testing import FakeRunner
from tests.support.helpers import api_profile


class CountingLedger(Ledger):
    looks = 0

    async def stale_running(self, *args: Any, **kwargs: Any) -> list[Task]:
        self.looks += 1
        return await super().stale_running(*args, **kwargs)


async def _looks_over(tmp_path: Path, time_scale: float, seconds: float) -> int:
    store = SqliteStore(tmp_path / f"d-{time_scale}.db")
    await store.migrate()
    clock = FakeClock(time_scale=time_scale)
    events = EventBus()
    profiles = {"m-a": api_profile("m-a", "prov-a")}
    ledger = CountingLedger(store, clock, profiles, events, retry_delay_s=0.0)
    accounts = await AccountBook.load(store, clock, events)
    lane = LaneSpec("api:prov-a", Kind.API, "prov-a", ("api-model:m-a",), ("m-a",), 1)
    await accounts.ensure([(lane.owner, lane.kind)])
    scheduler = Scheduler(
        ledger=ledger,
        clock=clock,
        lanes={lane.name: lane},
        runners={Kind.API: FakeRunner()},
        accounts=accounts,
        profiles=profiles,
        results_dir=tmp_path / "results",
    )
    try:
        # A round every scaled half second, as the tick makes them.
        step = clock.scaled(0.5)
        for _ in range(round(seconds / 0.5)):
            await scheduler.round()
            clock.advance(step)
        return ledger.looks
    finally:
        await scheduler.shutdown()
        await store.close()


async def test_stale_tasks_are_looked_for_every_few_seconds_not_every_round(
    tmp_path: Path,
) -> None:
    assert STALE_LOOK_S == 5.0
    # 20 nominal seconds of rounds: a look at 0, 5, 10, 15 s.
    assert await _looks_over(tmp_path, 1.0, 20.0) == 4
    # Scaled like the stale bound itself.
    assert await _looks_over(tmp_path, 0.1, 20.0) == 4
