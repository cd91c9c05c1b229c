"""A host that stops cleanly is not reported dead by the others; one that
stops with API jobs still running is, after the stale bound, and its jobs are
recovered (PostgreSQL: the only store several hosts share)."""

from __future__ import annotations

import asyncio

import pytest

from dispatcher.clock import FakeClock
from dispatcher.hosts.watch import HostWatch
from dispatcher.models import Kind, State, Task
from dispatcher.store import Store, open_store
from dispatcher.store.hosts import Lease
from tests.support.pgdb import migrated_database


def _watch(store: Store, clock: FakeClock, host: str, dead: list[str]) -> HostWatch:
    async def on_dead(name: str) -> None:
        dead.append(name)

    async def on_lost(account: str) -> None:
        raise AssertionError(f"no lease here: {account}")

    watch = HostWatch(store, clock, host, shared=True, on_dead=on_dead, on_lost=on_lost)
    watch.take_over_dead = True
    return watch


def _task(task_id: str, now: float) -> Task:
    return Task(
        id=task_id,
        model="m",
        kind=Kind.API,
        queue="g",
        params={"prompt": "p"},
        fingerprint=f"fp-{task_id}",
        created_at=now,
    )


@pytest.mark.parametrize("leaves_a_job_running", [False, True])
async def test_a_clean_stop_is_not_a_death_unless_it_leaves_jobs_running(
    leaves_a_job_running: bool, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()
    with migrated_database() as url:
        a_store, b_store = await open_store(url, "a"), await open_store(url, "b")
        try:
            dead: list[str] = []
            a, b = _watch(a_store, clock, "a", dead), _watch(b_store, clock, "b", [])
            await a.register()
            await b.register()
            if leaves_a_job_running:
                await b_store.insert_tasks([_task("t1", clock.now())])
                run = {"owner": "prov", "host": "b", "started_at": clock.now()}
                assert await b_store.claim_next(["g"], 10.0, run) is not None
            await b.aclose()

            clock.advance(a.stale_s + 1)
            await a.beat()

            silent = [r.getMessage() for r in caplog.records if "is silent for" in r.getMessage()]
            if leaves_a_job_running:
                assert dead == ["b"] and len(silent) == 1
                still = await a_store.tasks_in_state(State.RUNNING, host="b")
                assert [t.id for t in still] == ["t1"]  # left for `_take_over`
            else:
                assert dead == [] and silent == []
                (b_row,) = [h for h in await a_store.list_hosts() if h.id == "b"]
                assert not b_row.alive
                # And it comes back as a live host when it starts again.
                await b.register()
                assert [h.id for h in await a_store.list_hosts() if h.alive] == ["a", "b"]
        finally:
            await a_store.close()
            await b_store.close()


async def test_an_account_released_while_its_lease_renews_is_not_reported_lost(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """`accounts remove` can land while a heartbeat's renewal of that very
    lease is in flight: the heartbeat goes on (no crash that stops the
    service) and does not report a lease lost or close a lane for it."""
    clock = FakeClock()
    with migrated_database() as url:
        store = await open_store(url, "a")
        try:
            lost: list[str] = []

            async def on_lost(account: str) -> None:
                lost.append(account)

            async def on_dead(host: str) -> None:
                raise AssertionError(f"no other host here: {host}")

            watch = HostWatch(store, clock, "a", shared=True, on_dead=on_dead, on_lost=on_lost)
            await watch.register()
            await watch.bind(["kept", "removed"])
            renewing = asyncio.Event()
            go_on = asyncio.Event()
            renew = store.renew_lease

            async def held_renewal(lease: Lease, now: float, ttl_s: float) -> Lease | None:
                if lease.account == "removed":
                    renewing.set()
                    await go_on.wait()
                return await renew(lease, now, ttl_s)

            store.renew_lease = held_renewal  # type: ignore[method-assign]
            beat = asyncio.create_task(watch.beat())
            await renewing.wait()
            await watch.release("removed")
            go_on.set()
            await beat

            assert lost == []
            assert sorted(watch.leases) == ["kept"]
            assert "removed" not in watch.refused
            assert not [r for r in caplog.records if "lost" in r.getMessage()]
            assert [x.account for x in await store.list_leases()] == ["kept"]
        finally:
            await store.close()


async def test_a_beat_that_fails_unexpectedly_does_not_end_the_heartbeat(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One beat meeting a bug is logged with its traceback, and the next
    beats still renew the host's leases (without them, another host would
    take its accounts while their tasks still run here)."""
    clock = FakeClock(time_scale=0.001)
    with migrated_database() as url:
        store = await open_store(url, "a")
        try:
            watch = _watch(store, clock, "a", [])
            await watch.register()
            await watch.bind(["kept"])
            heartbeat = store.host_heartbeat
            calls = 0

            async def fails_once(host: str, now: float) -> bool:
                nonlocal calls
                calls += 1
                if calls == 1:
                    raise RuntimeError("a bug in one beat")
                return await heartbeat(host, now)

            store.host_heartbeat = fails_once  # type: ignore[method-assign]
            watch.start()
            for _ in range(200):
                if watch.beats >= 3:
                    break
                await asyncio.sleep(0.01)
            await watch.aclose()
            assert watch.beats >= 3
            failed = [r for r in caplog.records if "failed unexpectedly" in r.getMessage()]
            assert len(failed) == 1 and failed[0].exc_info is not None
        finally:
            await store.close()
