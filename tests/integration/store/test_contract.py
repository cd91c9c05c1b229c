"""The `Store` contract, run against both backends on real databases.

Every test runs on a SQLite file and on a fresh PostgreSQL database; what a
caller may rely on is asserted once, for both. Races are real: several
stores, each with its own connections, on one database.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from dispatcher.models import (
    Account,
    Attempt,
    CacheEntry,
    Job,
    JobState,
    Kind,
    State,
    Task,
    TaskError,
)
from dispatcher.store import Store, open_store
from dispatcher.store.hosts import Fence, Lease, LeaseRefused, Quota
from dispatcher.store.migrations import latest_version
from tests.integration.store.conftest import OpenStore
from tests.support.pgdb import migrated_database


def _task(
    task_id: str,
    *,
    group: str = "g",
    model: str = "m",
    fingerprint: str | None = None,
    created_at: float = 1.0,
    job_id: str | None = None,
    ref: str | None = None,
    prompt: str = "a prompt",
    **fields: Any,
) -> Task:
    return Task(
        id=task_id,
        model=model,
        kind=Kind.API,
        queue=group,
        params={"prompt": prompt},
        fingerprint=fingerprint or f"fp-{task_id}",
        created_at=created_at,
        job_id=job_id,
        ref=ref,
        **fields,
    )


RUN = {"owner": "prov", "host": "h1"}


@pytest.mark.empty_database
async def test_migrations_reach_the_latest_version_and_rerun_as_no_ops(
    open_stores: OpenStore, database_url: str
) -> None:
    # Three hosts starting at once on a new database: one migrates, all agree.
    stores = await asyncio.gather(*(open_stores(f"h{i}") for i in range(3)))
    dialect = "sqlite" if database_url.startswith("sqlite") else "postgresql"
    for store in stores:
        assert await store.schema_version() == latest_version(dialect)
        await store.migrate()
        assert await store.schema_version() == latest_version(dialect)


async def test_tasks_and_jobs_round_trip_and_list(store: Store) -> None:
    job = Job("job-1", "a batch", 5.0)
    stored = await store.insert_tasks(
        [
            _task("t-a", job_id="job-1", ref="r1", prompt="a red fox", created_at=5.0),
            _task("t-b", job_id="job-1", ref="r2", prompt="naïve café 100%_done", created_at=5.0),
        ],
        job,
    )
    single = (await store.insert_tasks([_task("t-c", model="m2", group="g2")]))[0]
    assert [t.seq for t in stored] == sorted(t.seq for t in stored) and single.seq > stored[1].seq
    assert await store.get_task("t-a") == stored[0]
    assert await store.get_task("nope") is None
    assert [t.id for t in await store.get_tasks(["t-c", "nope", "t-a"])] == ["t-a", "t-c"]
    assert await store.get_tasks([]) == []
    got_job = await store.get_job("job-1")
    assert got_job is not None and (got_job.name, got_job.created_at) == ("a batch", 5.0)
    assert await store.list_jobs() == [got_job]
    assert [t.id for t in await store.job_tasks("job-1")] == ["t-a", "t-b"]
    assert await store.job_counts("job-1") == {State.PENDING: 2}
    # Newest first, filtered, paged.
    assert [t.id for t in await store.list_tasks()] == ["t-c", "t-b", "t-a"]
    assert [t.id for t in await store.list_tasks(model="m2")] == ["t-c"]
    assert [t.id for t in await store.list_tasks(job_id="job-1", limit=1)] == ["t-b"]
    assert [t.id for t in await store.list_tasks(before_seq=stored[1].seq)] == ["t-a"]
    assert [t.id for t in await store.list_tasks(text="café 100%_")] == ["t-b"]
    assert [t.id for t in await store.list_tasks(text="r1")] == ["t-a"]  # the ref
    assert [t.id for t in await store.list_tasks(text="100%x")] == []  # % is literal
    assert [t.id for t in await store.list_tasks(states=[State.RUNNING])] == []
    # A job's tasks in job order, paged on, by ref (its % and _ literal); counts per model.
    assert [t.id for t in await store.list_tasks(job_id="job-1", oldest_first=True)] == [
        "t-a",
        "t-b",
    ]
    later = await store.list_tasks(oldest_first=True, after_seq=stored[0].seq)
    assert [t.id for t in later] == ["t-b", "t-c"]
    assert [t.id for t in await store.list_tasks(ref="r2")] == ["t-b"]
    assert [t.id for t in await store.list_tasks(ref="r%")] == []
    assert await store.job_model_counts("job-1") == {("m", State.PENDING): 2}
    assert await store.ids_with_prefix("tasks", "t-") == ["t-a", "t-b", "t-c"]
    assert await store.ids_with_prefix("jobs", "job", limit=5) == ["job-1"]
    assert await store.ids_with_prefix("tasks", "T-") == []
    assert [j.id for j in await store.list_jobs(states=[JobState.RUNNING])] == ["job-1"]
    assert [j.id for j in await store.list_jobs(states=[JobState.SUCCESS])] == []
    assert [j.id for j in await store.list_jobs(text="batch")] == ["job-1"]
    summary = (await store.job_summaries(["job-1"]))["job-1"]
    assert summary.counts == {State.PENDING: 2} and summary.from_cache == 0
    assert await store.state_counts() == {("m", "pending"): 2, ("m2", "pending"): 1}


async def test_update_is_a_compare_and_set_on_state_attempt_and_cancel(store: Store) -> None:
    await store.insert_tasks([_task("t1")])
    claimed = await store.claim_next(["g"], 10.0, {**RUN, "started_at": 10.0})
    assert claimed is not None and claimed.state is State.RUNNING and claimed.host == "h1"
    # Wrong state, wrong attempt: refused, nothing written.
    assert (
        await store.update_task("t1", expect_state=State.PENDING, changes={"stage": None}) is None
    )
    assert (
        await store.update_task(
            "t1", expect_state=State.RUNNING, expect_attempt=2, changes={"remote_id": "x"}
        )
        is None
    )
    flagged = await store.update_task(
        "t1", expect_state=State.RUNNING, expect_attempt=1, changes={"cancel_requested": True}
    )
    assert flagged is not None and flagged.cancel_requested
    ended = Attempt(
        task_id="t1",
        attempt=1,
        queue="g",
        owner="prov",
        outcome=State.SUCCESS,
        started_at=10.0,
        ended_at=12.0,
        error=None,
        stage_durations={"generating": 2.0},
    )
    # A cancel was asked: an outcome that must not override it is refused...
    assert (
        await store.update_task(
            "t1",
            expect_state=State.RUNNING,
            changes={"state": State.SUCCESS},
            unless_cancel_requested=True,
            ended=ended,
        )
        is None
    )
    assert await store.task_attempts("t1") == []  # ...and its history row with it
    done = await store.update_task(
        "t1",
        expect_state=State.RUNNING,
        changes={
            "state": State.FAILED,
            "error": TaskError("boom", "it broke"),
            "finished_at": 12.0,
        },
        ended=ended,
    )
    assert done is not None and done.error == TaskError("boom", "it broke")
    assert await store.task_attempts("t1") == [ended]
    assert await store.get_task("t1") == done


async def test_claim_takes_the_oldest_ready_task_of_the_groups(store: Store) -> None:
    await store.insert_tasks(
        [
            _task("late", not_before=100.0),
            _task("first"),
            _task("other-group", group="x"),
            _task("second"),
        ]
    )
    got = [await store.claim_next(["g"], 50.0, RUN) for _ in range(3)]
    assert [t.id if t else None for t in got] == ["first", "second", None]
    late = await store.claim_next(["g", "x"], 100.0, RUN)
    assert late is not None and late.id == "late"  # seq order across the groups
    other = await store.claim_next(["g", "x"], 100.0, RUN)
    assert other is not None and other.id == "other-group"
    assert await store.claim_next([], 100.0, RUN) is None
    assert [t.id for t in await store.tasks_in_state(State.RUNNING, host="h1")] == [
        "late",
        "first",
        "other-group",
        "second",
    ]
    assert await store.tasks_in_state(State.RUNNING, host="h2") == []


async def test_queue_positions_and_counts(store: Store) -> None:
    tasks = await store.insert_tasks(
        [_task(f"q{i}", group="g" if i % 2 else "h") for i in range(6)]
    )
    assert await store.queued_counts() == {"g": 3, "h": 3}
    assert await store.count_ahead("g", tasks[5].seq) == 2
    await store.claim_next(["g"], 10.0, RUN)
    assert await store.count_ahead("g", tasks[5].seq) == 1
    assert await store.queued_counts() == {"g": 2, "h": 3}
    assert await store.running_owners("g") == 1 and await store.running_owners("h") == 0
    # Both at once (a pending task's answer), the owners only when asked for.
    assert await store.queue_place("g", tasks[5].seq, owners=True) == (1, 1)
    assert await store.queue_place("g", tasks[5].seq, owners=False) == (1, 0)
    assert await store.queue_place("h", tasks[4].seq, owners=True) == (2, 0)


async def test_concurrent_claims_from_several_connections_never_share_a_task(
    open_stores: OpenStore,
) -> None:
    stores = [await open_stores(f"h{i}") for i in range(4)]
    await stores[0].insert_tasks([_task(f"c{i:02d}") for i in range(24)])

    async def drain(store: Store, host: str) -> list[str]:
        ids = []
        while (task := await store.claim_next(["g"], 10.0, {**RUN, "host": host})) is not None:
            ids.append(task.id)
        return ids

    taken = await asyncio.gather(*(drain(s, f"h{i}") for i, s in enumerate(stores)))
    every = [task_id for ids in taken for task_id in ids]
    assert sorted(every) == [f"c{i:02d}" for i in range(24)]  # each once, none lost
    for ids in taken:
        assert ids == sorted(ids)  # FIFO as each host saw it


async def test_two_identical_submits_at_once_make_one_task(open_stores: OpenStore) -> None:
    a, b = await open_stores("h1"), await open_stores("h2")
    results = await asyncio.gather(
        *(
            store.insert_unless_twin(_task(f"dup-{i}", fingerprint="same", created_at=100.0), 70.0)
            for i, store in enumerate([a, b, a, b])
        )
    )
    inserted = [task for task, fresh in results if fresh]
    assert len(inserted) == 1
    assert {task.id for task, _ in results} == {inserted[0].id}
    # Outside the window, or after the twin failed, a new task is made.
    assert (
        await a.insert_unless_twin(_task("later", fingerprint="same", created_at=200.0), 170.0)
    )[1]
    assert await a.find_by_fingerprint("same", 170.0) == await a.get_task("later")


async def test_leases_grant_one_host_and_fence_old_tokens(open_stores: OpenStore) -> None:
    h1, h2 = await open_stores("h1"), await open_stores("h2")
    first = await h1.acquire_lease("acct", "h1", now=0.0, ttl_s=30.0)
    assert isinstance(first, Lease) and first.host == "h1"
    refused = await h2.acquire_lease("acct", "h2", now=10.0, ttl_s=30.0)
    assert isinstance(refused, LeaseRefused) and refused.holder == "h1"
    assert "'h1'" in refused.message
    renewed = await h1.renew_lease(first, now=20.0, ttl_s=30.0)
    assert renewed is not None and renewed.expires_at == 50.0 and renewed.token == first.token
    assert await h1.list_leases() == [renewed]

    await h1.insert_tasks([_task("w1", group="web"), _task("w2", group="web")])
    old = Fence("acct", first.token)
    task = await h1.claim_next(
        ["web"], 21.0, {"owner": "acct", "lease_token": first.token}, fence=old
    )
    assert task is not None and task.lease_token == first.token
    beat = await h1.update_task(
        task.id, expect_state=State.RUNNING, changes={"heartbeat_at": 22.0}, fence=old
    )
    assert beat is not None

    # The lease lapses; h2 takes the account with a newer token.
    taken = await h2.acquire_lease("acct", "h2", now=60.0, ttl_s=30.0)
    assert isinstance(taken, Lease) and taken.host == "h2" and taken.token > first.token
    assert await h1.renew_lease(renewed, now=61.0, ttl_s=30.0) is None  # h1 lost it
    # h1's late writes carry the old token: refused, the row untouched.
    assert (
        await h1.update_task(
            task.id, expect_state=State.RUNNING, changes={"state": State.SUCCESS}, fence=old
        )
        is None
    )
    assert (await h1.get_task(task.id)).state is State.RUNNING  # type: ignore[union-attr]
    assert await h1.claim_next(["web"], 61.0, {"owner": "acct"}, fence=old) is None
    fresh = await h2.claim_next(["web"], 61.0, {"owner": "acct"}, fence=Fence("acct", taken.token))
    assert fresh is not None and fresh.id == "w2"
    assert not await h1.release_lease(renewed)  # not h1's any more
    assert await h2.release_lease(taken)
    assert await h2.list_leases() == []
    again = await h1.acquire_lease("acct", "h1", now=62.0, ttl_s=30.0)
    assert isinstance(again, Lease) and again.token > taken.token  # tokens never repeat


async def test_a_dead_hosts_lease_can_be_taken_at_once(open_stores: OpenStore) -> None:
    h1, h2 = await open_stores("h1"), await open_stores("h2")
    await h1.register_host("h1", now=0.0)
    assert isinstance(await h1.acquire_lease("acct", "h1", now=0.0, ttl_s=1000.0), Lease)
    assert await h2.mark_host_dead("h1", heartbeat_before=10.0, now=10.0)
    taken = await h2.acquire_lease("acct", "h2", now=11.0, ttl_s=30.0)
    assert isinstance(taken, Lease) and taken.host == "h2"


async def test_hosts_register_beat_and_are_declared_dead_once(open_stores: OpenStore) -> None:
    a, b, c = await open_stores("a"), await open_stores("b"), await open_stores("c")
    await a.register_host("a", now=100.0, url="http://a:1")
    await b.register_host("b", now=100.0)
    assert await a.host_heartbeat("a", now=130.0)
    assert [h.id for h in await c.stale_hosts(heartbeat_before=120.0)] == ["b"]
    # Two hosts declare b dead at once: one of them does.
    verdicts = await asyncio.gather(
        a.mark_host_dead("b", heartbeat_before=120.0, now=131.0),
        c.mark_host_dead("b", heartbeat_before=120.0, now=131.0),
    )
    assert sorted(verdicts) == [False, True]
    assert not await b.host_heartbeat("b", now=132.0)  # b learns it was declared dead
    assert not await a.mark_host_dead("a", heartbeat_before=120.0, now=133.0)  # a is fresh
    hosts = {h.id: h for h in await c.list_hosts()}
    assert hosts["a"].alive and hosts["a"].url == "http://a:1" and not hosts["b"].alive
    await b.register_host("b", now=140.0)
    assert all(h.alive for h in await c.list_hosts())
    assert await c.stale_hosts(heartbeat_before=125.0) == []


async def test_a_providers_quota_holds_across_hosts_in_the_claim(open_stores: OpenStore) -> None:
    stores = [await open_stores(f"h{i}") for i in range(3)]
    await stores[0].insert_tasks([_task(f"p{i}", group="api-model:m") for i in range(8)])
    quota = Quota("prov", 2)

    async def claim(store: Store) -> Task | None:
        return await store.claim_next(["api-model:m"], 10.0, RUN, quota=quota)

    first = await asyncio.gather(*(claim(s) for s in stores for _ in range(3)))
    running = [t for t in first if t is not None]
    assert len(running) == 2
    assert await claim(stores[1]) is None
    # Another provider's quota is its own.
    other = await stores[2].claim_next(
        ["api-model:m"], 10.0, {**RUN, "owner": "prov-b"}, quota=Quota("prov-b", 1)
    )
    assert other is not None
    done = running[0]
    await stores[0].update_task(
        done.id, expect_state=State.RUNNING, changes={"state": State.SUCCESS}
    )
    assert await claim(stores[2]) is not None  # a slot freed, on any host
    assert await claim(stores[1]) is None


async def test_retry_after_gate_is_shared_and_never_moves_back(open_stores: OpenStore) -> None:
    a, b = await open_stores("a"), await open_stores("b")
    assert await b.get_gate("prov") == 0.0
    await a.set_gate("prov", 150.0)
    assert await b.get_gate("prov") == 150.0
    await b.set_gate("prov", 120.0)  # an earlier Retry-After seen later
    assert await a.get_gate("prov") == 150.0
    await b.set_gate("prov", 180.0)
    assert await a.get_gate("prov") == 180.0


async def test_stale_running_and_recent_durations(store: Store) -> None:
    await store.insert_tasks([_task("s1"), _task("s2")])
    await store.claim_next(["g"], 10.0, {**RUN, "started_at": 10.0, "heartbeat_at": 10.0})
    await store.claim_next(["g"], 50.0, {**RUN, "started_at": 50.0, "heartbeat_at": 50.0})
    assert [t.id for t in await store.stale_running(heartbeat_before=40.0)] == ["s1"]
    await store.update_task(
        "s1", expect_state=State.RUNNING, changes={"state": State.SUCCESS, "finished_at": 14.5}
    )
    assert await store.recent_durations("m") == [4.5]


async def test_accounts_and_web_accounts_persist(open_stores: OpenStore) -> None:
    a = await open_stores()
    await a.upsert_account(Account("acct", Kind.WEB, enabled=False, reason="captcha"))
    await a.upsert_account(Account("prov", Kind.API, cooldown_until=99.0))
    await a.put_web_account("extra", ["m2", "m1"], added_at=5.0)
    await a.put_web_account("extra", ["m3"], added_at=6.0)
    b = await open_stores()
    accounts = await b.get_accounts()
    assert (accounts["acct"].enabled, accounts["acct"].reason) == (False, "captcha")
    assert accounts["prov"].cooldown_until == 99.0
    assert await b.get_web_accounts() == {"extra": ("m3",)}
    await b.delete_account("acct")
    await b.delete_web_account("extra")
    assert set(await a.get_accounts()) == {"prov"} and await a.get_web_accounts() == {}


async def test_cache_index_round_trip(store: Store) -> None:
    index = store.cache_index
    entry = CacheEntry("fp", "m", {"text": "x"}, size_bytes=3, created_at=1.0, last_used_at=1.0)
    index.cache_put(entry)
    assert index.cache_get("fp") == entry
    index.cache_touch("fp", 5.0)
    assert index.cache_entries() == [CacheEntry("fp", "m", {"text": "x"}, 3, 1.0, 5.0)]
    index.cache_delete("fp")
    assert index.cache_get("fp") is None and index.cache_entries() == []


async def test_a_cache_entry_belongs_to_the_host_holding_its_files() -> None:
    """PostgreSQL only: on SQLite one host holds every entry."""
    with migrated_database() as url:
        a, b = await open_store(url, "host-a"), await open_store(url, "host-b")
        try:
            entry = CacheEntry("fp", "m", {"text": "x"}, 3, created_at=1.0, last_used_at=1.0)
            a.cache_index.cache_put(entry)
            # Its files are on host a: a miss on host b, which never drops it.
            assert b.cache_index.cache_get("fp") is None
            assert b.cache_index.cache_entries() == []
            b.cache_index.cache_delete("fp")
            b.cache_index.cache_touch("fp", 9.0)
            assert a.cache_index.cache_get("fp") == entry
            # Host b makes its own copy: two rows, one per host.
            b.cache_index.cache_put(CacheEntry("fp", "m", {"text": "y"}, 3, 2.0, 2.0))
            assert a.cache_index.cache_get("fp") == entry
            assert b.cache_index.cache_get("fp") == CacheEntry(
                "fp", "m", {"text": "y"}, 3, 2.0, 2.0
            )
        finally:
            await a.close()
            await b.close()


async def test_queue_positions_count_every_hosts_tasks() -> None:
    """PostgreSQL only (SQLite serves one host): the positions are the database's."""
    with migrated_database() as url:
        a, b = await open_store(url, "host-a"), await open_store(url, "host-b")
        try:
            first = await a.insert_tasks([_task("x1"), _task("x2")])
            (mine,) = await b.insert_tasks([_task("x3")])
            assert await b.count_ahead("g", mine.seq) == 2
            assert await b.queued_counts() == {"g": 3}
            await a.claim_next(["g"], 10.0, RUN)
            assert await b.count_ahead("g", mine.seq) == 1
            assert await a.count_ahead("g", first[1].seq) == 0
            await b.claim_next(["g"], 10.0, {"owner": "other", "host": "host-b"})
            assert await a.running_owners("g") == 2 and await a.running_owners("h") == 0
        finally:
            await a.close()
            await b.close()


async def test_each_finish_of_a_job_is_told_by_exactly_one_host(open_stores: OpenStore) -> None:
    a, b = await open_stores("h1"), await open_stores("h2")
    await a.insert_tasks([_task("t1", job_id="job-1")], Job("job-1", "a batch", 5.0))
    # Both hosts saw the job end at 20.0 (each finished one of its last tasks).
    told = await asyncio.gather(*(s.tell_job_finish("job-1", 20.0) for s in (a, b, a, b)))
    assert sorted(told) == [False, False, False, True]
    # A retried task's new finish is another finish: told once more.
    assert await b.tell_job_finish("job-1", 31.5) is True
    assert await a.tell_job_finish("job-1", 31.5) is False
    assert await a.tell_job_finish("no-such-job", 31.5) is False


async def test_a_reached_budget_is_told_by_exactly_one_host_a_day(open_stores: OpenStore) -> None:
    stores = [await open_stores(f"h{i}") for i in range(3)]
    midnight = 86_400.0 * 20_000
    # Three hosts find the demo budget reached at once (and one again later).
    told = await asyncio.gather(
        *(s.tell_budget_reached("demo", midnight, midnight - 60.0) for s in [*stores, stores[0]])
    )
    assert sorted(told) == [False, False, False, True]
    # Another provider, or the same one the next day, is told again, once.
    assert await stores[1].tell_budget_reached("acme", midnight, midnight - 5.0) is True
    assert await stores[2].tell_budget_reached("demo", midnight + 86_400.0, midnight + 9.0) is True
    assert await stores[0].tell_budget_reached("demo", midnight + 86_400.0, midnight + 9.5) is False
