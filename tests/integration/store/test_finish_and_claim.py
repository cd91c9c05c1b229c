"""A run's end write and its lane's next claim in one round trip (issue 31).

`Store.finish_and_claim` on PostgreSQL: one pipeline, one transaction; the
claim is the one `claim_next` would have made (order, quota across hosts),
counted by the store itself (`PostgresStore.round_trips`) on a real server.
On SQLite: one transaction, one commit, the same claim.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from dispatcher.models import Attempt, Kind, State, Task
from dispatcher.store import open_store
from dispatcher.store.base import NextClaim, TaskWrite
from dispatcher.store.hosts import Quota
from dispatcher.store.postgres import PostgresStore
from dispatcher.store.sqlite import SqliteStore
from tests.support.pgdb import migrated_database

QUEUE = "g"


def _task(task_id: str, *, priority: int = 0, created_at: float = 1.0) -> Task:
    return Task(
        id=task_id,
        model="m",
        kind=Kind.API,
        queue=QUEUE,
        params={"prompt": task_id},
        fingerprint=f"fp-{task_id}",
        created_at=created_at,
        priority=priority,
    )


def _run(host: str) -> dict[str, Any]:
    return {"owner": "demo", "host": host}


def _success(now: float) -> dict[str, Any]:
    return {"state": State.SUCCESS, "result": {"text": "ok"}, "finished_at": now, "stage": None}


async def _pg(url: str, host: str) -> PostgresStore:
    store = await open_store(url, host)
    assert isinstance(store, PostgresStore)
    return store


@pytest.fixture
async def store() -> AsyncIterator[PostgresStore]:
    with migrated_database() as url:
        opened = await _pg(url, "h1")
        try:
            yield opened
        finally:
            await opened.close()


async def _finish_and_claim(
    store: PostgresStore | SqliteStore, running: Task, now: float, **claim: Any
) -> Any:
    return await store.finish_and_claim(
        TaskWrite(
            running.id,
            expect_state=State.RUNNING,
            expect_attempt=running.attempt,
            changes=_success(now),
            unless_cancel_requested=True,
            ended=Attempt(
                task_id=running.id,
                attempt=running.attempt,
                queue=running.queue,
                owner="demo",
                outcome=State.SUCCESS,
                started_at=running.started_at,
                ended_at=now,
            ),
        ),
        NextClaim((QUEUE,), now, _run(store.host), **claim),
    )


async def test_the_end_and_the_next_claim_are_one_round_trip(store: PostgresStore) -> None:
    await store.insert_tasks([_task("t1"), _task("t2"), _task("t3")])
    running = await store.claim_next([QUEUE], 5.0, _run("h1"), quota=Quota("demo", 2))
    assert running is not None and running.id == "t1"

    before = store.round_trips.total
    both = await _finish_and_claim(store, running, 6.0, quota=Quota("demo", 2))
    assert store.round_trips.total - before == 1
    assert both is not None
    assert both.ended is not None and both.ended.state is State.SUCCESS
    assert both.claimed is not None and both.claimed.id == "t2"
    assert both.claimed.state is State.RUNNING and both.claimed.host == "h1"
    # Both written: the history row of the ended attempt too.
    assert [a.outcome for a in await store.task_attempts("t1")] == [State.SUCCESS]
    assert (await store.get_task("t2")) == both.claimed
    # Without a quota (nor budget) as well: one round trip.
    before = store.round_trips.total
    both = await _finish_and_claim(store, both.claimed, 7.0)
    assert store.round_trips.total - before == 1
    assert both is not None and both.claimed is not None and both.claimed.id == "t3"


@contextlib.asynccontextmanager
async def _fresh(backend: str, folder: Path) -> AsyncIterator[PostgresStore | SqliteStore]:
    if backend == "sqlite":
        lite = SqliteStore(folder / f"{secrets.token_hex(4)}.db", "h1")
        await lite.migrate()
        try:
            yield lite
        finally:
            await lite.close()
        return
    with migrated_database() as url:
        pg = await _pg(url, "h1")
        try:
            yield pg
        finally:
            await pg.close()


@pytest.mark.parametrize("backend", ["postgresql", "sqlite"])
async def test_the_claimed_task_is_the_one_claim_next_would_claim(
    backend: str, tmp_path: Path
) -> None:
    """Two databases alike: one ends a run then claims, the other does both
    at once; the same task is claimed (priorities and their aging, FIFO)."""
    tasks = [
        _task("low", priority=0, created_at=1.0),
        _task("high", priority=5, created_at=3.0),
        _task("mid", priority=2, created_at=2.0),
    ]
    claimed: list[list[str]] = []
    for together in (False, True):
        async with _fresh(backend, tmp_path) as store:
            await store.insert_tasks([_task("first", priority=9), *tasks])
            running = await store.claim_next([QUEUE], 5.0, _run("h1"))
            assert running is not None and running.id == "first"
            order = []
            for step in range(3):
                now = 6.0 + step
                if together:
                    both = await _finish_and_claim(store, running, now)
                    assert both is not None
                    nxt = both.claimed
                else:
                    await store.update_task(
                        running.id,
                        expect_state=State.RUNNING,
                        changes=_success(now),
                    )
                    nxt = await store.claim_next([QUEUE], now, _run("h1"))
                assert nxt is not None
                order.append(nxt.id)
                running = nxt
            claimed.append(order)
    assert claimed[0] == claimed[1] == ["high", "mid", "low"]


async def test_a_refused_end_write_still_claims_and_says_so(store: PostgresStore) -> None:
    await store.insert_tasks([_task("t1"), _task("t2")])
    running = await store.claim_next([QUEUE], 5.0, _run("h1"))
    assert running is not None
    # A cancel asked meanwhile: the end write (unless_cancel_requested) is refused.
    await store.update_task("t1", expect_state=State.RUNNING, changes={"cancel_requested": True})
    both = await _finish_and_claim(store, running, 6.0)
    assert both is not None and both.ended is None
    assert both.claimed is not None and both.claimed.id == "t2"
    current = await store.get_task("t1")
    assert current is not None and current.state is State.RUNNING
    assert await store.task_attempts("t1") == []


async def _advisory_waiters(conn: psycopg.AsyncConnection[Any]) -> int:
    cur = await conn.execute(
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE wait_event_type = 'Lock' AND wait_event = 'advisory'"
    )
    row = await cur.fetchone()
    return int(row[0]) if row else 0


async def _hold_quota_lock(conn: psycopg.AsyncConnection[Any]) -> None:
    """Another host's claim under the quota "demo" holding its lock."""
    await conn.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))", ("quota:demo",))


async def _release_quota_lock(conn: psycopg.AsyncConnection[Any]) -> None:
    await conn.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", ("quota:demo",))


async def _claim_after_the_quota_lock(
    store: PostgresStore, conn: psycopg.AsyncConnection[Any], now: float, limit: int
) -> Task | None:
    """A claim under the quota "demo" waits for the lock `conn` holds: what
    it claims once the lock is released."""
    claiming = asyncio.create_task(
        store.claim_next([QUEUE], now, _run(store.host), quota=Quota("demo", limit))
    )
    for _ in range(500):
        if await _advisory_waiters(conn):
            break
        await asyncio.sleep(0.01)
    assert await _advisory_waiters(conn) == 1
    assert not claiming.done()
    await _release_quota_lock(conn)
    return await asyncio.wait_for(claiming, 30)


async def test_an_end_that_frees_the_slot_claims_without_the_quota_lock() -> None:
    """The end frees the very slot its claim takes (one transaction): the
    provider's running count is the same before and after, so the pair does
    not wait for other hosts' claims under the quota; the quota still holds."""
    with migrated_database() as url:
        store = await _pg(url, "h1")
        other = await psycopg.AsyncConnection.connect(url, autocommit=True)
        try:
            await store.insert_tasks([_task("t1"), _task("t2"), _task("t3")])
            running = await store.claim_next([QUEUE], 5.0, _run("h1"), quota=Quota("demo", 1))
            assert running is not None
            await _hold_quota_lock(other)
            both = await asyncio.wait_for(
                _finish_and_claim(store, running, 6.0, quota=Quota("demo", 1)), 10
            )
            assert both is not None and both.ended is not None
            assert both.ended.state is State.SUCCESS
            assert both.claimed is not None and both.claimed.id == "t2"
            states = {t.id: t.state for t in await store.get_tasks(["t1", "t2", "t3"])}
            assert states == {"t1": State.SUCCESS, "t2": State.RUNNING, "t3": State.PENDING}
            # A claim that would add a running task still takes turns on the lock.
            added = await _claim_after_the_quota_lock(store, other, 7.0, 2)
            assert added is not None and added.id == "t3"
        finally:
            await other.close()
            await store.close()


async def test_a_refused_end_write_claims_nothing_without_the_quota_lock() -> None:
    """A refused end (a cancel asked meanwhile) frees no slot: a claim in its
    transaction would add a running task without taking turns, so it claims
    nothing; the lane's own claim after it waits for the lock, then counts."""
    with migrated_database() as url:
        store = await _pg(url, "h1")
        other = await psycopg.AsyncConnection.connect(url, autocommit=True)
        try:
            await store.insert_tasks([_task("t1"), _task("t2")])
            running = await store.claim_next([QUEUE], 5.0, _run("h1"), quota=Quota("demo", 2))
            assert running is not None
            await store.update_task(
                "t1", expect_state=State.RUNNING, changes={"cancel_requested": True}
            )
            await _hold_quota_lock(other)
            both = await asyncio.wait_for(
                _finish_and_claim(store, running, 6.0, quota=Quota("demo", 2)), 10
            )
            assert both is not None and both.ended is None  # refused: cancel asked
            assert both.claimed is None
            pending = await store.get_task("t2")
            assert pending is not None and pending.state is State.PENDING
            claimed = await _claim_after_the_quota_lock(store, other, 6.0, 2)
            assert claimed is not None and claimed.id == "t2"
        finally:
            await other.close()
            await store.close()


async def test_a_claim_known_to_find_nothing_is_not_sent(store: PostgresStore) -> None:
    # The listener live, as a service runs it: the view keeps what claims read.
    store.gates.seed([])
    await store.insert_tasks([_task("t1")])
    running = await store.claim_next([QUEUE], 5.0, _run("h1"))
    assert running is not None
    # That claim read that nothing is pending now.
    before = store.round_trips.total
    assert await _finish_and_claim(store, running, 5.2) is None  # declined: nothing sent
    assert store.round_trips.total == before
    current = await store.get_task("t1")
    assert current is not None and current.state is State.RUNNING


async def test_the_quota_holds_with_two_hosts_ending_and_claiming_at_once() -> None:
    """Two hosts, quota 2 over both: each ends its runs with the next claim
    while the other claims on its own; never more than 2 run."""
    limit = 2
    with migrated_database() as url:
        h1, h2 = await _pg(url, "h1"), await _pg(url, "h2")
        try:
            await h1.insert_tasks([_task(f"t{i:03d}", created_at=float(i)) for i in range(40)])
            peaks: list[int] = []

            async def running_now() -> int:
                return len(await h1.tasks_in_state(State.RUNNING))

            async def host(store: PostgresStore) -> None:
                mine = await store.claim_next(
                    [QUEUE], 5.0, _run(store.host), quota=Quota("demo", limit)
                )
                for step in range(30):
                    now = 6.0 + step
                    if mine is None:
                        mine = await store.claim_next(
                            [QUEUE], now, _run(store.host), quota=Quota("demo", limit)
                        )
                        await asyncio.sleep(0)
                        continue
                    both = await _finish_and_claim(store, mine, now, quota=Quota("demo", limit))
                    if both is None:  # declined (quota known full): end alone
                        await store.update_task(
                            mine.id, expect_state=State.RUNNING, changes=_success(now)
                        )
                        mine = None
                    else:
                        mine = both.claimed
                    peaks.append(await running_now())

            await asyncio.gather(host(h1), host(h2))
            assert peaks and max(peaks) <= limit
            done = await h1.tasks_in_state(State.SUCCESS)
            assert len(done) >= 20  # both hosts made progress
            assert len({t.id for t in done}) == len(done)
        finally:
            await h1.close()
            await h2.close()


async def test_the_quota_holds_with_more_hosts_than_slots() -> None:
    """Four hosts, quota 2 over all: the ends' claims (no lock: each frees
    the slot it takes) race the claims of hosts that hold nothing (each adds
    a running task, taking turns on the lock); never more than 2 run."""
    limit = 2
    with migrated_database() as url:
        hosts = [await _pg(url, f"h{n}") for n in range(4)]
        try:
            await hosts[0].insert_tasks(
                [_task(f"t{i:03d}", created_at=float(i)) for i in range(80)]
            )
            peaks: list[int] = []

            async def host(store: PostgresStore) -> None:
                mine: Task | None = None
                for step in range(40):
                    now = 6.0 + step
                    if mine is None:
                        mine = await store.claim_next(
                            [QUEUE], now, _run(store.host), quota=Quota("demo", limit)
                        )
                    else:
                        both = await _finish_and_claim(store, mine, now, quota=Quota("demo", limit))
                        if both is None:  # declined (quota known full): end alone
                            await store.update_task(
                                mine.id, expect_state=State.RUNNING, changes=_success(now)
                            )
                        mine = None if both is None else both.claimed
                    peaks.append(len(await store.tasks_in_state(State.RUNNING)))

            await asyncio.gather(*(host(store) for store in hosts))
            assert peaks and max(peaks) <= limit
            done = await hosts[0].tasks_in_state(State.SUCCESS)
            assert len(done) >= 20
        finally:
            for store in hosts:
                await store.close()


async def test_sqlite_ends_and_claims_in_one_commit(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "d.db")
    await store.migrate()
    try:
        await store.insert_tasks([_task("t1"), _task("t2"), _task("t3")])
        running = await store.claim_next([QUEUE], 5.0, _run(""), quota=Quota("demo", 1))
        assert running is not None and running.id == "t1"
        # The quota (1) is full until t1 ends: the end comes first, so its
        # slot is free for the claim in the same transaction.
        both = await _finish_and_claim(store, running, 6.0, quota=Quota("demo", 1))
        assert both is not None and both.ended is not None and both.claimed is not None
        assert both.ended.state is State.SUCCESS and both.claimed.id == "t2"
        assert [a.outcome for a in await store.task_attempts("t1")] == [State.SUCCESS]
        states = {t.id: t.state for t in await store.list_tasks()}
        assert states == {"t1": State.SUCCESS, "t2": State.RUNNING, "t3": State.PENDING}
        # A refused end write (a cancel asked meanwhile) writes no end, and
        # the claim still runs, as on PostgreSQL; the quota is then full.
        await store.update_task(
            "t2", expect_state=State.RUNNING, changes={"cancel_requested": True}
        )
        refused = await _finish_and_claim(store, both.claimed, 7.0, quota=Quota("demo", 1))
        assert refused is not None and refused.ended is None and refused.claimed is None
        refused = await _finish_and_claim(store, both.claimed, 7.0, quota=Quota("demo", 2))
        assert refused is not None and refused.ended is None
        assert refused.claimed is not None and refused.claimed.id == "t3"
        assert await store.task_attempts("t2") == []
    finally:
        await store.close()
