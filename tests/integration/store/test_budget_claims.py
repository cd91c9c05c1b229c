"""Issue 30 in the store, on SQLite and PostgreSQL: a provider's daily budget
is checked in the claim (never overspent by a race, across hosts), a queue is
served by priority, then deadline, then FIFO (the SQL agrees with
`pricing.order_key`), and a job sums what its tasks cost."""

from __future__ import annotations

import asyncio
import random
from typing import Any

from dispatcher.models import Job, Kind, State, Task
from dispatcher.pricing import Budget, fits_budget, order_key
from dispatcher.store import Store
from tests.integration.store.conftest import OpenStore

RUN = {"owner": "acme", "host": "h1"}
DAY = 86_400.0


def _task(task_id: str, *, created_at: float = 1.0, **fields: Any) -> Task:
    return Task(
        id=task_id,
        model="m",
        kind=Kind.API,
        queue="api-model:m",
        params={"prompt": task_id},
        fingerprint=f"fp-{task_id}",
        created_at=created_at,
        **fields,
    )


async def test_a_daily_budget_holds_exactly_under_three_hosts_claiming_at_once(
    open_stores: OpenStore,
) -> None:
    stores = [await open_stores(f"h{i}") for i in range(3)]
    now = 10 * DAY + 3600.0
    budget = Budget("acme", 10.0, 10 * DAY)
    # Yesterday's spend counts for yesterday only.
    await stores[0].insert_tasks([_task("old", cost_estimate=9.0)])
    await stores[0].claim_next(["api-model:m"], now - DAY, {**RUN, "started_at": now - DAY})
    await stores[0].insert_tasks([_task(f"t{i}", cost_estimate=1.5) for i in range(30)])

    async def claim(store: Store) -> Task | None:
        return await store.claim_next(
            ["api-model:m"], now, {**RUN, "started_at": now}, budget=budget
        )

    # Every host hammers the provider at once, again and again.
    claimed: list[Task] = []
    for _ in range(3):
        got = await asyncio.gather(*(claim(s) for s in stores for _ in range(4)))
        claimed += [t for t in got if t is not None]
    assert len(claimed) == 6  # 6 x $1.50 = $9 of $10: a 7th would cross it
    assert len({t.id for t in claimed}) == 6
    assert await stores[1].spent_since("acme", budget.since) == 9.0
    # Finished at the price estimated: the spend stays, nothing more fits.
    for task in claimed:
        await stores[2].update_task(
            task.id, expect_state=State.RUNNING, changes={"state": State.SUCCESS, "cost": 1.5}
        )
    assert await claim(stores[0]) is None
    assert await stores[0].spent_since("acme", budget.since) == 9.0
    assert await stores[0].cheapest_ready(["api-model:m"], now) == 1.5
    assert not fits_budget(spent_usd=9.0, cost_usd=1.5, limit_usd=10.0)
    # A cheaper task still fits; another provider's budget is its own.
    await stores[0].insert_tasks([_task("cheap", cost_estimate=1.0)])
    cheap = await claim(stores[1])
    assert cheap is not None and cheap.id == "cheap"
    other = await stores[2].claim_next(
        ["api-model:m"],
        now,
        {"owner": "other", "host": "h3", "started_at": now},
        budget=Budget("other", 10.0, 10 * DAY),
    )
    assert other is not None
    # Tomorrow the budget is whole again.
    tomorrow = await stores[0].claim_next(
        ["api-model:m"],
        now + DAY,
        {**RUN, "started_at": now + DAY},
        budget=Budget("acme", 10.0, 11 * DAY),
    )
    assert tomorrow is not None
    assert (await stores[0].cost_by_provider())["acme"] == 9.0


async def test_a_queue_is_served_by_priority_then_deadline_then_fifo(store: Store) -> None:
    rng = random.Random(30)
    now = 5000.0
    tasks = [
        _task(
            f"q{i:02d}",
            created_at=rng.choice([0.0, 1000.0, 4000.0, 4900.0]),
            priority=rng.choice([-1, 0, 0, 2, 5]),
            deadline=rng.choice([None, 6000.0, 7000.0]),
        )
        for i in range(24)
    ]
    # Waited 5000 s at one level per 600 s: -1 + 8 outranks a fresh 5.
    tasks += [
        _task("urgent", created_at=4900.0, priority=5),
        _task("aged", created_at=0.0, priority=-1),
    ]
    stored = await store.insert_tasks(tasks)
    expected = sorted(
        stored,
        key=lambda t: order_key(
            priority=t.priority,
            deadline=t.deadline,
            seq=t.seq,
            created_at=t.created_at,
            now=now,
            aging_step_s=600.0,
        ),
    )
    served = []
    for _ in stored:
        task = await store.claim_next(["api-model:m"], now, RUN, aging_step_s=600.0)
        assert task is not None
        served.append(task.id)
    assert served == [t.id for t in expected]
    assert served.index("aged") < served.index("urgent")


async def test_a_job_sums_what_its_tasks_cost(store: Store) -> None:
    job = Job("job-c", "priced", 1.0)
    await store.insert_tasks(
        [
            _task("c1", job_id="job-c", cost_estimate=0.5),
            _task("c2", job_id="job-c", cost_estimate=0.25),
            _task("c3", job_id="job-c", cost_estimate=4.0),
        ],
        job,
    )
    for cost in (0.5, 0.3):  # the second: the vendor reported its own usage
        task = await store.claim_next(["api-model:m"], 5.0, RUN)
        assert task is not None
        await store.update_task(
            task.id, expect_state=State.RUNNING, changes={"state": State.SUCCESS, "cost": cost}
        )
    summary = (await store.job_summaries(["job-c"]))["job-c"]
    assert abs(summary.cost_usd - 0.8) < 1e-9
    fetched = await store.get_task("c2")
    assert fetched is not None and fetched.cost == 0.3 and fetched.cost_estimate == 0.25


async def test_a_fallback_waits_in_several_queues_and_is_claimed_once(
    open_stores: OpenStore,
) -> None:
    stores = [await open_stores(f"h{i}") for i in range(3)]
    both = _task("both", alt_queues=("web:w", "api-model:x_y"))
    await stores[0].insert_tasks([both, _task("plain")])
    stored = await stores[0].get_task("both")
    assert stored is not None and stored.alt_queues == ("web:w", "api-model:x_y")

    async def claim(store: Store, queue: str) -> Task | None:
        return await store.claim_next([queue], 10.0, RUN)

    # Every host's lanes of all three queues claim at once: one of them wins it.
    got = await asyncio.gather(
        *(claim(s, q) for s in stores for q in ("api-model:m", "web:w", "api-model:x_y"))
    )
    taken = [t.id for t in got if t is not None]
    assert sorted(taken) == ["both", "plain"]
    # `_` in a queue name is no wildcard: "api-model:xzy" is another queue.
    await stores[0].insert_tasks([_task("only-x_y", alt_queues=("api-model:x_y",))])
    assert await claim(stores[1], "api-model:xzy") is None
    other = await claim(stores[1], "api-model:x_y")
    assert other is not None and other.id == "only-x_y"
