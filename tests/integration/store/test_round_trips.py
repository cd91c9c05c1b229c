"""What each task write costs in round trips to PostgreSQL (issue 31).

A task's life is an insert, a claim and an end; with several hosts each is
one exchange with the server, whatever guards it (a provider's quota, a
twin check, an attempt's history row): at most transitions + 1 per task.
Counted by the store itself (`PostgresStore.round_trips`), on a real server.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import Counter
from pathlib import Path

import psycopg
import pytest

from dispatcher.clock import FakeClock
from dispatcher.errors import StoreError
from dispatcher.events import Event, EventBus, TaskNoticed
from dispatcher.hosts.crosshost import RemoteTasks
from dispatcher.models import Attempt, CacheEntry, State
from dispatcher.store import NextClaim, open_store, postgres_cache
from dispatcher.store.hosts import Quota
from dispatcher.store.pglisten import TaskListener
from dispatcher.store.postgres import PostgresStore
from dispatcher.store.postgres_cache import FLUSH_AT, PostgresCacheIndex
from dispatcher.tasks.cache import ResultCache
from tests.support.tasks import api_task

RUN = {"owner": "demo", "host": "h1"}


@pytest.fixture
def store(pg_store_at: tuple[PostgresStore, str]) -> PostgresStore:
    return pg_store_at[0]


def trips(store: PostgresStore, since: int) -> int:
    return store.round_trips.total - since


async def test_a_task_costs_one_round_trip_per_write(store: PostgresStore) -> None:
    before = store.round_trips.total
    _, inserted = await store.insert_unless_twin(api_task("t1"), created_since=0.0)
    assert inserted and trips(store, before) == 1

    # A twin found is one round trip too, and answers the first task.
    before = store.round_trips.total
    twin, inserted = await store.insert_unless_twin(
        api_task("t2", fingerprint="fp-t1"), created_since=0.0
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
    await store.insert_tasks([api_task("plain"), api_task("urgent", priority=5)])
    before = store.round_trips.total
    first = await store.claim_next(["g"], 5.0, RUN, quota=Quota("demo", 5))
    second = await store.claim_next(["g"], 5.0, RUN, quota=Quota("demo", 5))
    nothing = await store.claim_next(["g"], 5.0, RUN)
    assert [first and first.id, second and second.id, nothing] == ["urgent", "plain", None]
    assert trips(store, before) == 3


async def test_a_quota_full_claims_nothing_in_one_round_trip(store: PostgresStore) -> None:
    await store.insert_tasks([api_task("a"), api_task("b")])
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
    assert not index.puts_inline  # a put would read this host's rows first
    assert index.cache_get("fp-first") is None  # the first use reads this host's rows
    assert index.puts_inline  # now a put is kept in memory for the writer thread
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


async def test_a_text_result_is_kept_on_the_loop_thread_once_the_index_is_read(
    store: PostgresStore, tmp_path: Path
) -> None:
    cache = ResultCache(store.cache_index, tmp_path, FakeClock(), max_bytes=10**9, ttl_s=3600.0)
    text = {"text": "hi", "files": [], "meta": {}}
    # Before the host's fingerprints are read, a put would wait for the
    # network: a worker thread's job (`store_result`).
    assert not cache.store_text_here("a" * 64, "chat", text)
    assert cache.miss_here("b" * 64) is False and cache.lookup("b" * 64) is None
    before = store.round_trips.total
    assert cache.store_text_here("a" * 64, "chat", text)
    assert cache.lookup("a" * 64) == text and trips(store, before) == 0


async def test_a_submit_answer_reads_its_place_with_the_insert(store: PostgresStore) -> None:
    await store.insert_tasks([api_task("first"), api_task("second")])
    assert await store.claim_next(["g"], 5.0, RUN) is not None  # "first" runs: one owner
    before = store.round_trips.total
    third, inserted = await store.insert_unless_twin(api_task("third"), created_since=0.0)
    assert inserted
    # The place in the answer to the submit: "second" ahead, one owner serving.
    assert await store.queue_place("g", third.seq, owners=True) == (1, 1)
    assert trips(store, before) == 1
    # Asked again later, it is read afresh (another task claimed meanwhile).
    assert await store.claim_next(["g"], 5.0, RUN) is not None
    before = store.round_trips.total
    assert await store.queue_place("g", third.seq, owners=False) == (0, 0)
    assert trips(store, before) == 1
    # A forced task (no twin check) too.
    (fourth,) = await store.insert_tasks([api_task("fourth")])
    before = store.round_trips.total
    assert await store.queue_place("g", fourth.seq, owners=False) == (1, 0)
    assert trips(store, before) == 0


def _entry(fingerprint: str, used_at: float = 1.0) -> CacheEntry:
    return CacheEntry(
        fingerprint=fingerprint,
        model="m",
        result={"text": fingerprint, "files": [], "meta": {}},
        size_bytes=2,
        created_at=1.0,
        last_used_at=used_at,
    )


async def test_results_kept_in_the_cache_are_written_together(store: PostgresStore) -> None:
    index = store.cache_index
    assert isinstance(index, PostgresCacheIndex)
    assert index.cache_get("fp-warm") is None  # the first use reads this host's rows
    before = store.round_trips.total
    for n in range(10):
        index.cache_put(_entry(f"fp-{n}"))
    index.cache_touch("fp-3", 7.0)
    # Answered from memory before they are written.
    assert index.cache_get("fp-3") == _entry("fp-3", 7.0)
    index.flush()
    index.flush()  # nothing left: no round trip
    assert trips(store, before) == 1
    # Written, as kept: another index of this host reads them.
    index.cache_delete("fp-9")
    index.close()
    again = PostgresCacheIndex(store.url, "h1")
    try:
        entries = {e.fingerprint: e for e in again.cache_entries()}
        assert sorted(entries) == sorted(f"fp-{n}" for n in range(9))
        assert entries["fp-3"].last_used_at == 7.0
    finally:
        again.close()


async def test_a_batch_of_puts_replaces_what_an_earlier_batch_wrote(store: PostgresStore) -> None:
    # One statement writes a batch; an entry written before and put again
    # (a result cached anew) is replaced, not doubled or refused, whatever
    # number types its figures come in.
    index = store.cache_index
    assert isinstance(index, PostgresCacheIndex)
    assert index.cache_get("fp-warm") is None
    index.cache_put(_entry("fp-old"))
    index.cache_put(_entry("fp-kept"))
    index.flush()
    renewed = dataclasses.replace(_entry("fp-old"), model="m2", size_bytes=7, created_at=5)
    index.cache_put(renewed)
    index.cache_put(dataclasses.replace(_entry("fp-new"), last_used_at=9))
    before = store.round_trips.total
    index.flush()
    assert trips(store, before) == 1
    index.close()
    again = PostgresCacheIndex(store.url, "h1")
    try:
        entries = {e.fingerprint: e for e in again.cache_entries()}
        assert sorted(entries) == ["fp-kept", "fp-new", "fp-old"]
        assert entries["fp-old"] == renewed
        assert entries["fp-new"].last_used_at == 9.0
        assert entries["fp-kept"] == _entry("fp-kept")
    finally:
        again.close()


@pytest.mark.parametrize(("batch", "flush_s"), [(1, 0.05), (FLUSH_AT, 60.0)])
async def test_the_writer_thread_writes_each_batch_after_its_wait_or_once_full(
    store: PostgresStore, monkeypatch: pytest.MonkeyPatch, batch: int, flush_s: float
) -> None:
    # The writer is woken by a batch's first put and by a full batch only: a
    # lone put is written once FLUSH_S has passed, a full batch without
    # waiting for it. Twice: the second batch finds the writer asleep.
    monkeypatch.setattr(postgres_cache, "FLUSH_S", flush_s)
    index = store.cache_index
    assert isinstance(index, PostgresCacheIndex)
    assert index.cache_get("fp-warm") is None
    other = PostgresCacheIndex(store.url, "h1")
    try:
        for first in (0, batch):
            for n in range(first, first + batch):
                index.cache_put(_entry(f"fp-{n}"))
            deadline = time.monotonic() + 10
            while len(other.cache_entries()) < first + batch:
                assert time.monotonic() < deadline, "the writer thread never wrote the batch"
                await asyncio.sleep(0.02)
    finally:
        other.close()


async def test_a_full_quota_is_not_asked_again_until_a_task_of_it_ends(
    store: PostgresStore,
) -> None:
    listening = await store_listening(store)
    try:
        await store.insert_tasks([api_task("a"), api_task("b"), api_task("c")])
        quota = Quota("demo", 1)
        a = await store.claim_next(["g"], 5.0, RUN, quota=quota)
        assert a is not None
        # Full, as the claim that filled it read: the next ones need no round trip.
        before = store.round_trips.total
        assert await store.claim_next(["g"], 5.1, RUN, quota=quota) is None
        assert await store.claim_next(["g"], 5.2, RUN, quota=quota) is None
        assert await store.claim_next(["g"], 5.3, RUN, quota=quota) is None
        assert trips(store, before) == 0
        assert store.claim_view.skipped == 3
        # A larger quota asks.
        bigger = await store.claim_next(["g"], 5.3, RUN, quota=Quota("demo", 2))
        assert bigger is not None
        # The provider's task ends here: the next claim asks, and gets "c".
        done = await store.update_task(
            a.id, expect_state=State.RUNNING, changes={"state": State.SUCCESS}
        )
        assert done is not None
        claimed = await store.claim_next(["g"], 5.4, RUN, quota=Quota("demo", 2))
        assert claimed is not None and claimed.id == "c"
        # Believed for a second of the claims' clock at most.
        before = store.round_trips.total
        assert await store.claim_next(["g"], 5.5, RUN, quota=Quota("demo", 2)) is None
        assert await store.claim_next(["g"], 5.6, RUN, quota=Quota("demo", 2)) is None
        assert trips(store, before) == 0
        assert await store.claim_next(["g"], 7.0, RUN, quota=Quota("demo", 2)) is None
        assert trips(store, before) == 1
    finally:
        await listening.aclose()
    # Not listening: every claim asks.
    before = store.round_trips.total
    assert await store.claim_next(["g"], 7.1, RUN, quota=Quota("demo", 2)) is None
    assert await store.claim_next(["g"], 7.2, RUN, quota=Quota("demo", 2)) is None
    assert trips(store, before) == 2


async def test_another_hosts_end_frees_the_quota_known_full(store: PostgresStore) -> None:
    other = await open_store(store.url, "h2")
    events = EventBus()
    relay = RemoteTasks(store.url, "h1", store, events)
    await relay.start()
    try:
        await store.insert_tasks([api_task("a"), api_task("b")])
        quota = Quota("demo", 1)
        theirs = await other.claim_next(["g"], 5.0, {"owner": "demo", "host": "h2"}, quota=quota)
        assert theirs is not None
        assert await store.claim_next(["g"], 5.0, RUN, quota=quota) is None
        before = store.round_trips.total
        assert await store.claim_next(["g"], 5.1, RUN, quota=quota) is None
        assert trips(store, before) == 0
        # h2's task ends: its notice reaches h1's view before h1's bus hears it.
        heard = asyncio.Event()

        def on_event(event: Event) -> None:
            if isinstance(event, TaskNoticed) and event.state is State.SUCCESS:
                heard.set()

        events.listen(on_event)
        await other.update_task(
            theirs.id, expect_state=State.RUNNING, changes={"state": State.SUCCESS}
        )
        await asyncio.wait_for(heard.wait(), 10)
        mine = await store.claim_next(["g"], 5.2, RUN, quota=quota)
        assert mine is not None and mine.id == "b"
    finally:
        await relay.aclose()
        await other.close()


async def store_listening(store: PostgresStore) -> TaskListener:
    """A listener keeping the store's view live, as the service's relay does."""
    listener = TaskListener(store.url, store.host, lambda _: None, gates=store.gates)
    await listener.start()
    return listener


async def test_nothing_pending_is_not_asked_again_until_a_task_is(store: PostgresStore) -> None:
    other = await open_store(store.url, "h2")
    events = EventBus()
    relay = RemoteTasks(store.url, "h1", store, events)
    await relay.start()
    try:
        before = store.round_trips.total
        assert await store.claim_next(["g"], 5.0, RUN) is None  # asks: nothing pending
        assert await store.claim_next(["g"], 5.1, RUN) is None
        assert await store.claim_next(["other"], 5.2, RUN, quota=Quota("demo", 3)) is None
        assert trips(store, before) == 1
        # This host's submit: the next claim asks, and gets it.
        await store.insert_unless_twin(api_task("mine"), created_since=0.0)
        claimed = await store.claim_next(["g"], 5.3, RUN)
        assert claimed is not None and claimed.id == "mine"
        # Another host's submit, heard through the relay before its bus hears it.
        heard = asyncio.Event()
        events.listen(lambda event: heard.set())
        await other.insert_tasks([api_task("theirs")])
        await asyncio.wait_for(heard.wait(), 10)
        claimed = await store.claim_next(["g"], 5.4, RUN)
        assert claimed is not None and claimed.id == "theirs"
    finally:
        await relay.aclose()
        await other.close()


def _claim(now: float, quota: Quota | None = None) -> NextClaim:
    return NextClaim(("g",), now, {**RUN, "started_at": now}, quota=quota)


async def test_a_submit_with_a_free_slot_is_inserted_and_claimed_in_one_round_trip(
    store: PostgresStore,
) -> None:
    listening = await store_listening(store)
    try:
        before = store.round_trips.total
        both = await store.insert_and_claim(api_task("new"), 0.0, _claim(5.0))
        assert both is not None and both.inserted and both.task.id == "new"
        assert both.claimed is not None and both.claimed.id == "new"
        assert both.claimed.state is State.RUNNING and both.claimed.owner == "demo"
        assert trips(store, before) == 1
        # Nothing else pending, as the claim read: the scheduler's round after
        # the submit asks nothing.
        before = store.round_trips.total
        assert await store.claim_next(["g"], 5.1, RUN) is None
        assert trips(store, before) == 0

        # A task waiting before it is claimed first (its turn); the new one waits.
        await store.insert_tasks([api_task("older")])
        both = await store.insert_and_claim(api_task("newer"), 0.0, _claim(5.2))
        assert both is not None and both.inserted
        assert both.claimed is not None and both.claimed.id == "older"
        (newer,) = await store.get_tasks(["newer"])
        assert newer.state is State.PENDING

        # A twin: not inserted (the twin answered), the claim still made.
        both = await store.insert_and_claim(
            api_task("again", fingerprint="fp-new"), 0.0, _claim(5.3)
        )
        assert both is not None and not both.inserted and both.task.id == "new"
        assert both.claimed is not None and both.claimed.id == "newer"

        # Under a quota: its lock rides in the de-dup lock's statement, three
        # statements in all (each costs ~0.1 ms of our CPU through psycopg).
        roomy = Quota("demo", 10)
        await store.insert_tasks([api_task("queued")])
        sent = Counter(store.round_trips.by_statement)
        both = await store.insert_and_claim(api_task("under-quota"), 0.0, _claim(5.35, roomy))
        assert both is not None and both.claimed is not None and both.claimed.id == "queued"
        (label,) = (Counter(store.round_trips.by_statement) - sent).keys()
        assert label.startswith("pipeline: ") and len(label.split("; ")) == 3

        # The provider's quota known full: not sent together (the insert alone).
        full = Quota("demo", 3)
        await store.insert_tasks([api_task("waiting")])
        assert await store.claim_next(["g"], 5.4, RUN, quota=full) is None  # it read: 3 running
        assert await store.insert_and_claim(api_task("later"), 0.0, _claim(5.5, full)) is None
        assert (await store.get_tasks(["later"])) == []
    finally:
        await listening.aclose()


async def test_a_submit_when_nothing_waits_is_inserted_running(store: PostgresStore) -> None:
    # This listener tells the store's view nothing of other hosts' tasks:
    # what another host inserts here is a task not heard yet.
    listening = await store_listening(store)
    other = await open_store(store.url, "h2")
    roomy = Quota("demo", 2)
    try:
        assert await store.claim_next(["g"], 5.0, RUN) is None  # it read: nothing pending
        sent = Counter(store.round_trips.by_statement)
        both = await store.insert_and_claim(api_task("new"), 0.0, _claim(5.1, roomy))
        assert both is not None and both.inserted and both.task.id == "new"
        assert both.claimed is not None and both.claimed.id == "new"
        # Two statements (the locks, the insert): no claim, the row written once.
        (label,) = (Counter(store.round_trips.by_statement) - sent).keys()
        assert label.startswith("pipeline: ") and len(label.split("; ")) == 2
        assert "UPDATE" not in label
        (row,) = await store.get_tasks(["new"])
        assert row.state is State.RUNNING and row.owner == "demo" and row.host == "h1"
        assert row.started_at == 5.1 and row.stage == both.claimed.stage
        assert row.seq == both.claimed.seq and row.attempt == both.claimed.attempt == 1

        # Another host's task waits, not heard here: the server finds it, and
        # inserts the new task pending; the older one is claimed first.
        await other.insert_tasks([api_task("theirs")])
        both = await store.insert_and_claim(api_task("mine"), 0.0, _claim(5.2, roomy))
        assert both is not None and both.inserted and both.claimed is None
        assert both.task.state is State.PENDING
        claimed = await store.claim_next(["g"], 5.3, RUN, quota=roomy)
        assert claimed is not None and claimed.id == "theirs"
        claimed = await store.claim_next(["g"], 5.4, RUN, quota=roomy)
        assert claimed is None  # the quota's two slots: "new" and "theirs"
        (mine,) = await store.get_tasks(["mine"])
        assert mine.state is State.PENDING

        # Nothing waits, yet another host filled the quota unheard (a third
        # slot, taken there): the new task pending, unclaimed.
        await other.update_task("mine", expect_state=State.PENDING, changes={"state": "canceled"})
        await other.insert_tasks([api_task("filler", queue="x")])
        assert await other.claim_next(["x"], 5.5, {"owner": "demo", "host": "h2"}) is not None
        assert await store.claim_next(["g"], 5.5, RUN) is None  # nothing pending again
        assert store.claim_view.nothing_pending(5.6)
        three = Quota("demo", 3)
        both = await store.insert_and_claim(api_task("over"), 0.0, _claim(5.6, three))
        assert both is not None and both.inserted and both.claimed is None
        (over,) = await store.get_tasks(["over"])
        assert over.state is State.PENDING and over.owner is None

        # A twin: the twin answered, nothing inserted or claimed.
        assert await store.claim_next(["h"], 5.7, RUN) is None
        twin = api_task("again", queue="h", fingerprint="fp-new")
        both = await store.insert_and_claim(twin, 0.0, NextClaim(("h",), 5.7, RUN))
        assert both is not None and not both.inserted and both.task.id == "new"
        assert both.claimed is None and await store.get_tasks(["again"]) == []
    finally:
        await listening.aclose()
        await other.close()


async def test_a_task_with_the_queue_as_its_fallback_runs_before_a_new_one(
    store: PostgresStore,
) -> None:
    # Waiting in another queue, "g" its fallback, not heard here: the claim
    # would take it first, so the new task is not inserted running.
    listening = await store_listening(store)
    other = await open_store(store.url, "h2")
    try:
        assert await store.claim_next(["g"], 5.0, RUN) is None  # it read: nothing pending
        await other.insert_tasks([api_task("spare", queue="y", alt_queues=("g",))])
        both = await store.insert_and_claim(api_task("new"), 0.0, _claim(5.1))
        assert both is not None and both.inserted and both.claimed is None
        claimed = await store.claim_next(["g"], 5.2, RUN)
        assert claimed is not None and claimed.id == "spare"
    finally:
        await listening.aclose()
        await other.close()


async def test_a_submit_and_its_claim_are_one_transaction(store: PostgresStore) -> None:
    # A claim that fails writes neither: the caller then inserts alone.
    refuse = (
        "CREATE FUNCTION refuse_claims() RETURNS trigger LANGUAGE plpgsql AS "
        "$$ BEGIN RAISE EXCEPTION 'no claims today'; END $$",
        "CREATE TRIGGER refuse_claims BEFORE UPDATE ON tasks FOR EACH ROW "
        "WHEN (NEW.state = 'running') EXECUTE FUNCTION refuse_claims()",
    )
    async with await psycopg.AsyncConnection.connect(store.url, autocommit=True) as admin:
        for statement in refuse:
            await admin.execute(statement)
        with pytest.raises(StoreError, match="no claims today"):
            await store.insert_and_claim(api_task("lost"), 0.0, _claim(5.0))
        assert await store.get_tasks(["lost"]) == []
        await admin.execute("DROP TRIGGER refuse_claims ON tasks")
    both = await store.insert_and_claim(api_task("kept"), 0.0, _claim(5.1))
    assert both is not None and both.claimed is not None and both.claimed.id == "kept"
