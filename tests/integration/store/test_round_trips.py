"""What each task write costs in round trips to PostgreSQL (issue 31).

A task's life is an insert, a claim and an end; with several hosts each is
one exchange with the server, whatever guards it (a provider's quota, a
twin check, an attempt's history row): at most transitions + 1 per task.
Counted by the store itself (`PostgresStore.round_trips`), on a real server.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from dispatcher.models import Attempt, CacheEntry, Kind, State, Task
from dispatcher.store import open_store
from dispatcher.store.hosts import Quota
from dispatcher.store.postgres import PostgresStore
from tests.support.pgdb import migrated_database

RUN = {"owner": "demo", "host": "h1"}


def _task(task_id: str, *, priority: int = 0, fingerprint: str | None = None) -> Task:
    return Task(
        id=task_id,
        model="m",
        kind=Kind.API,
        queue="g",
        params={"prompt": task_id},
        fingerprint=fingerprint or f"fp-{task_id}",
        created_at=1.0,
        priority=priority,
    )


@pytest.fixture
async def store() -> AsyncIterator[PostgresStore]:
    with migrated_database() as url:
        opened = await open_store(url, "h1")
        assert isinstance(opened, PostgresStore)
        try:
            yield opened
        finally:
            await opened.close()


def trips(store: PostgresStore, since: int) -> int:
    return store.round_trips.total - since


async def test_a_task_costs_one_round_trip_per_write(store: PostgresStore) -> None:
    before = store.round_trips.total
    _, inserted = await store.insert_unless_twin(_task("t1"), created_since=0.0)
    assert inserted and trips(store, before) == 1

    # A twin found is one round trip too, and answers the first task.
    before = store.round_trips.total
    twin, inserted = await store.insert_unless_twin(
        _task("t2", fingerprint="fp-t1"), created_since=0.0
    )
    assert not inserted and twin.id == "t1" and trips(store, before) == 1

    # A claim under the provider's quota over all hosts: one round trip.
    before = store.round_trips.total
    claimed = await store.claim_next(["g"], 5.0, RUN, quota=Quota("demo", 2))
    assert claimed is not None and claimed.id == "t1"
    assert trips(store, before) == 1

    # The end of the attempt, with its history row: one round trip, both written.
    before = store.round_trips.total
    ended = Attempt(
        task_id="t1",
        attempt=1,
        queue="g",
        owner="demo",
        outcome=State.SUCCESS,
        started_at=5.0,
        ended_at=6.0,
    )
    done = await store.update_task(
        "t1",
        expect_state=State.RUNNING,
        expect_attempt=1,
        changes={"state": State.SUCCESS, "finished_at": 6.0},
        ended=ended,
    )
    assert done is not None and done.state is State.SUCCESS
    assert trips(store, before) == 1
    assert [a.outcome for a in await store.task_attempts("t1")] == [State.SUCCESS]

    # A write that no longer matches writes no history row.
    late = await store.update_task(
        "t1",
        expect_state=State.RUNNING,
        expect_attempt=1,
        changes={"state": State.FAILED},
        ended=ended,
    )
    assert late is None and len(await store.task_attempts("t1")) == 1


async def test_a_claim_looks_at_priorities_in_the_same_round_trip(store: PostgresStore) -> None:
    await store.insert_tasks([_task("plain"), _task("urgent", priority=5)])
    before = store.round_trips.total
    first = await store.claim_next(["g"], 5.0, RUN, quota=Quota("demo", 5))
    second = await store.claim_next(["g"], 5.0, RUN, quota=Quota("demo", 5))
    nothing = await store.claim_next(["g"], 5.0, RUN)
    assert [first and first.id, second and second.id, nothing] == ["urgent", "plain", None]
    assert trips(store, before) == 3


async def test_a_quota_full_claims_nothing_in_one_round_trip(store: PostgresStore) -> None:
    await store.insert_tasks([_task("a"), _task("b")])
    assert await store.claim_next(["g"], 5.0, RUN, quota=Quota("demo", 1)) is not None
    before = store.round_trips.total
    assert await store.claim_next(["g"], 5.0, RUN, quota=Quota("demo", 1)) is None
    assert trips(store, before) == 1
    # A pending task's place and the owners serving its queue: one read.
    before = store.round_trips.total
    (b,) = await store.get_tasks(["b"])
    assert await store.queue_place("g", b.seq, owners=True) == (0, 1)
    assert trips(store, before) == 2


async def test_a_cache_miss_is_known_without_a_round_trip(store: PostgresStore) -> None:
    index = store.cache_index
    assert not index.known_absent("fp-new")  # not read yet: it cannot tell
    assert index.cache_get("fp-first") is None  # the first use reads this host's rows
    before = store.round_trips.total
    assert index.known_absent("fp-new") and index.cache_get("fp-new") is None
    assert trips(store, before) == 0
    entry = CacheEntry(
        fingerprint="fp-new",
        model="m",
        result={"text": "hi", "files": [], "meta": {}},
        size_bytes=2,
        created_at=1.0,
        last_used_at=1.0,
    )
    index.cache_put(entry)
    assert not index.known_absent("fp-new")
    assert index.cache_get("fp-new") == entry
    index.cache_delete("fp-new")
    assert index.known_absent("fp-new")
