"""A host's heartbeats written together (`Store.heartbeat_tasks`, issue 31).

On both backends: each beat is `update_task`'s compare-and-set (a running
attempt, its lease's token when fenced), the answers come back in the
beats' order, and a refused beat leaves its row untouched. On PostgreSQL
the beats due at once cost one round trip, however many.
"""

from __future__ import annotations

from typing import Any

from dispatcher.models import Stage, State, Task
from dispatcher.store import Store, open_store
from dispatcher.store.beats import Heartbeat
from dispatcher.store.hosts import Fence, Lease
from dispatcher.store.postgres import PostgresStore
from tests.integration.store.conftest import OpenStore
from tests.support.pgdb import migrated_database
from tests.support.tasks import api_task


def _task(task_id: str, queue: str) -> Task:
    return api_task(task_id, queue=queue)


async def _running(store: Store, queue: str, changes: dict[str, Any], **guard: Any) -> Task:
    task = await store.claim_next([queue], 10.0, {**changes, "started_at": 10.0}, **guard)
    assert task is not None and task.state is State.RUNNING
    return task


async def test_beats_write_every_live_attempt_and_refuse_the_others(
    open_stores: OpenStore,
) -> None:
    store = await open_stores("h1")
    lease = await store.acquire_lease("acct", "h1", now=0.0, ttl_s=300.0)
    assert isinstance(lease, Lease)
    await store.insert_tasks(
        [_task("api-1", "api"), _task("api-2", "api"), _task("web-1", "web"), _task("idle", "x")]
    )
    api_1 = await _running(store, "api", {"owner": "prov", "host": "h1"})
    api_2 = await _running(store, "api", {"owner": "prov", "host": "h1"})
    fence = Fence("acct", lease.token)
    web_1 = await _running(
        store, "web", {"owner": "acct", "host": "h1", "lease_token": lease.token}, fence=fence
    )
    # A cancel asked for meanwhile (on another host, say) shows in the beat's answer.
    asked = await store.update_task(
        api_2.id, expect_state=State.RUNNING, changes={"cancel_requested": True}
    )
    assert asked is not None

    written = await store.heartbeat_tasks(
        [
            Heartbeat(api_1.id, api_1.attempt, 40.0, Stage.GENERATING),
            Heartbeat("idle", 1, 40.0, None),  # pending: not a run to beat for
            Heartbeat(api_2.id, api_2.attempt + 1, 40.0, None),  # another attempt's
            Heartbeat(web_1.id, web_1.attempt, 40.0, Stage.QUEUED, fence),
            Heartbeat(api_2.id, api_2.attempt, 41.0, Stage.DOWNLOADING),
        ]
    )

    assert [t.id if t is not None else None for t in written] == [
        "api-1",
        None,
        None,
        "web-1",
        "api-2",
    ]
    beaten = {t.id: t for t in written if t is not None}
    assert beaten["api-1"].heartbeat_at == 40.0 and beaten["api-1"].stage is Stage.GENERATING
    assert beaten["web-1"].stage is Stage.QUEUED
    assert beaten["api-2"].cancel_requested and beaten["api-2"].heartbeat_at == 41.0
    idle = await store.get_task("idle")
    assert idle is not None and idle.state is State.PENDING and idle.heartbeat_at is None
    for task_id, beat in beaten.items():
        assert await store.get_task(task_id) == beat  # what came back is what is stored
    assert await store.heartbeat_tasks([]) == []


async def test_a_beat_under_a_lost_lease_is_refused(open_stores: OpenStore) -> None:
    h1, h2 = await open_stores("h1"), await open_stores("h2")
    first = await h1.acquire_lease("acct", "h1", now=0.0, ttl_s=30.0)
    assert isinstance(first, Lease)
    await h1.insert_tasks([_task("web-1", "web"), _task("api-1", "api")])
    old = Fence("acct", first.token)
    web = await _running(
        h1, "web", {"owner": "acct", "host": "h1", "lease_token": first.token}, fence=old
    )
    api = await _running(h1, "api", {"owner": "prov", "host": "h1"})
    taken = await h2.acquire_lease("acct", "h2", now=60.0, ttl_s=30.0)  # h1's lapsed
    assert isinstance(taken, Lease) and taken.token > first.token

    written = await h1.heartbeat_tasks(
        [
            Heartbeat(web.id, web.attempt, 61.0, None, old),
            Heartbeat(api.id, api.attempt, 61.0, None),
        ]
    )

    assert written[0] is None  # the lease moved on: h1's beat is an earlier holder's
    assert written[1] is not None and written[1].heartbeat_at == 61.0
    row = await h1.get_task(web.id)
    assert row is not None and row.heartbeat_at == web.heartbeat_at


async def test_on_postgresql_the_beats_due_at_once_are_one_round_trip() -> None:
    with migrated_database() as url:
        store = await open_store(url, "h1")
        assert isinstance(store, PostgresStore)
        try:
            await store.insert_tasks([_task(f"t{i}", "api") for i in range(8)])
            running = [
                await _running(store, "api", {"owner": "prov", "host": "h1"}) for _ in range(8)
            ]
            before = store.round_trips.total

            written = await store.heartbeat_tasks(
                [Heartbeat(t.id, t.attempt, 50.0, Stage.GENERATING) for t in running]
            )

            assert store.round_trips.total - before == 1
            assert all(t is not None and t.heartbeat_at == 50.0 for t in written)
        finally:
            await store.close()
