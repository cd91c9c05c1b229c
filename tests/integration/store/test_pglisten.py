"""The task notices on a real PostgreSQL database: which writes send one, and who wrote it."""

from __future__ import annotations

import asyncio
import contextlib

import psycopg
import pytest

from dispatcher.models import State
from dispatcher.store import open_store, pglisten
from dispatcher.store.pglisten import CHANNEL, TaskListener
from dispatcher.store.pgnotice import TaskNotice, notice_header, own_prefix, parse_notice
from dispatcher.store.postgres import PostgresStore
from tests.support.pgdb import migrated_database
from tests.support.tasks import api_task

ODD_HOST = "rack 2\\node 7"  # a space and a backslash: escaped in the connection options


def test_a_notice_reads_back_with_a_host_holding_spaces() -> None:
    assert parse_notice("t1 running 1 rack 2 node") == TaskNotice(
        "t1", "running", True, "rack 2 node"
    )
    assert parse_notice("t1 pending 0") == TaskNotice("t1", "pending", False, "")
    assert parse_notice("garbage") is None


async def test_inserts_state_changes_and_cancels_are_heard_by_other_hosts_only() -> None:
    with migrated_database() as url:
        writer = await open_store(url, ODD_HOST)
        heard: asyncio.Queue[TaskNotice] = asyncio.Queue()
        other = TaskListener(url, "listener-host", heard.put_nowait)
        itself = TaskListener(url, ODD_HOST, heard.put_nowait)
        await other.start()
        await itself.start()
        try:
            await writer.insert_tasks([api_task("t1")])
            claimed = await writer.claim_next(["g"], 5.0, {"owner": "p", "host": ODD_HOST})
            assert claimed is not None
            # A heartbeat is not announced; a cancel and an end are.
            await writer.update_task(
                "t1", expect_state=State.RUNNING, changes={"heartbeat_at": 6.0}
            )
            await writer.update_task(
                "t1", expect_state=State.RUNNING, changes={"cancel_requested": True}
            )
            await writer.update_task(
                "t1", expect_state=State.RUNNING, changes={"state": State.CANCELED}
            )
            got = [await asyncio.wait_for(heard.get(), 10) for _ in range(4)]
            assert [(n.task_id, n.state, n.cancel_requested, n.origin) for n in got] == [
                ("t1", "pending", False, ODD_HOST),
                ("t1", "running", False, ODD_HOST),
                ("t1", "running", True, ODD_HOST),
                ("t1", "canceled", True, ODD_HOST),
            ]
            # Each carries the row as written: a host hearing it reads nothing back.
            rows = [n.task() for n in got]
            assert [t.state.value if t else None for t in rows] == [
                "pending",
                "running",
                "running",
                "canceled",
            ]
            assert rows[1] is not None and rows[1] == claimed
            # The writer's own listener heard nothing of it.
            assert itself.received == 0 and other.received == 4
        finally:
            await other.aclose()
            await itself.aclose()
            await writer.close()


async def test_no_notice_is_lost_or_reordered_while_the_listener_pings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Pings back to back: notices arrive both on the socket the listener
    # watches and in the middle of its queries (psycopg's notify handler).
    monkeypatch.setattr(pglisten, "PING_S", 0.001)
    with migrated_database() as url:
        heard: list[str] = []
        all_heard = asyncio.Event()

        def hear(notice: TaskNotice) -> None:
            heard.append(notice.task_id)
            if len(heard) == 300:
                all_heard.set()

        listener = TaskListener(url, "listener-host", hear)
        await listener.start()
        try:
            async with await psycopg.AsyncConnection.connect(url, autocommit=True) as sender:
                for n in range(300):
                    await sender.execute(
                        "SELECT pg_notify(%s, %s)", (CHANNEL, f"t{n} pending 0 elsewhere")
                    )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(all_heard.wait(), 10)
            assert heard == [f"t{n}" for n in range(300)]
            assert listener.reconnects == 0
        finally:
            await listener.aclose()


async def test_a_row_too_long_for_a_notice_is_announced_without_it() -> None:
    with migrated_database() as url:
        writer = await open_store(url, "writer")
        heard: asyncio.Queue[TaskNotice] = asyncio.Queue()
        listener = TaskListener(url, "listener-host", heard.put_nowait)
        await listener.start()
        try:
            long_task = api_task("t2")
            long_task = long_task.replace(params={"prompt": "x" * 9000})
            await writer.insert_tasks([api_task("t1"), long_task])
            got = [await asyncio.wait_for(heard.get(), 10) for _ in range(2)]
            assert [(n.task_id, n.state, n.origin) for n in got] == [
                ("t1", "pending", "writer"),
                ("t2", "pending", "writer"),
            ]
            # PostgreSQL takes at most 8000 bytes in a notice: the long row is read back.
            first = got[0].task()
            assert first is not None and first.params == {"prompt": "t1"}
            assert not got[1].carries_row and got[1].task() is None
        finally:
            await listener.aclose()
            await writer.close()


async def test_a_gate_set_on_one_host_is_read_on_another_without_a_round_trip() -> None:
    with migrated_database() as url:
        setter = await open_store(url, "h1")
        reader = await open_store(url, "h2")
        assert isinstance(setter, PostgresStore) and isinstance(reader, PostgresStore)
        # A gate set before the listener starts is read with its LISTEN.
        await setter.set_gate("prov", 100.0)
        heard: asyncio.Queue[TaskNotice] = asyncio.Queue()
        listener = TaskListener(url, "h2", heard.put_nowait, gates=reader.gates)
        try:
            # Without a listener the gate is read from the database.
            before = reader.round_trips.total
            assert await reader.get_gate("prov") == 100.0
            assert reader.round_trips.total - before == 1
            await listener.start()
            await setter.set_gate("prov", 150.0)
            await setter.set_gate("prov", 120.0)  # earlier: the gate stays at 150
            await setter.set_gate("other", 50.0)
            # Notices arrive in commit order: once a later task's is heard,
            # the gates' were taken in.
            await setter.insert_tasks([api_task("after")])
            await asyncio.wait_for(heard.get(), 10)
            assert reader.gates.heard_count == 2
            before = reader.round_trips.total
            assert await reader.get_gate("prov") == 150.0
            assert await reader.get_gate("other") == 50.0
            assert await reader.get_gate("never") == 0.0
            assert reader.round_trips.total - before == 0
            # Gate notices are not task notices.
            assert listener.received == 1
        finally:
            await listener.aclose()
        # Not listening: the database again.
        before = reader.round_trips.total
        assert await reader.get_gate("prov") == 150.0
        assert reader.round_trips.total - before == 1
        await setter.close()
        await reader.close()


async def test_a_hosts_own_row_notice_is_known_by_its_start() -> None:
    with migrated_database() as url:
        listening = await psycopg.AsyncConnection.connect(url, autocommit=True)
        await listening.execute(f"LISTEN {CHANNEL}")
        try:
            for n, host in enumerate(("bench-0", ODD_HOST, 'quote " host')):
                writer = await open_store(url, host)
                await writer.insert_tasks([api_task(f"t{n}")])
                await writer.close()
                gen = listening.notifies(timeout=10, stop_after=1)
                (notice,) = [n.payload async for n in gen]
                assert notice.startswith(own_prefix(host))
                assert not notice.startswith(own_prefix(host + "x"))
        finally:
            await listening.close()


async def test_notices_arriving_close_together_are_read_together(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Each read of the socket costs a wake-up of the loop: notices sent
    # while the last read is recent wait for the next read, all together.
    monkeypatch.setattr(pglisten, "READ_EVERY_S", 1.0)
    with migrated_database() as url:
        heard: list[str] = []
        listener = TaskListener(url, "listener-host", lambda notice: heard.append(notice.task_id))
        await listener.start()
        try:
            async with await psycopg.AsyncConnection.connect(url, autocommit=True) as sender:
                await sender.execute("SELECT pg_notify(%s, 't0 pending 0 elsewhere')", (CHANNEL,))
                for _ in range(500):
                    if heard:
                        break
                    await asyncio.sleep(0.01)
                assert heard == ["t0"] and listener.reads == 1
                # Ten commits, each its own notice, within the second the
                # listener leaves the socket alone.
                for n in range(1, 11):
                    await sender.execute(
                        "SELECT pg_notify(%s, %s)", (CHANNEL, f"t{n} pending 0 elsewhere")
                    )
                for _ in range(500):
                    if len(heard) == 11:
                        break
                    await asyncio.sleep(0.01)
            assert heard == [f"t{n}" for n in range(11)]
            assert listener.reads == 2
        finally:
            await listener.aclose()


async def test_a_real_notice_is_read_by_position_whatever_its_prompt_says() -> None:
    # What a user typed cannot pose as the row's state, cancel flag or owner.
    posing = '","state":"success","cancel_requested":1,"owner":"someone \\" else'
    with migrated_database() as url:
        writer = await open_store(url, ODD_HOST)
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as raw:
            payloads: list[str] = []
            raw.add_notify_handler(lambda notify: payloads.append(notify.payload))
            await raw.execute(f"LISTEN {CHANNEL}")
            task = api_task("t1").replace(params={"prompt": posing})
            await writer.insert_tasks([task])
            await writer.claim_next(["g"], 5.0, {"owner": "prov \\ one", "host": ODD_HOST})
            await raw.execute("SELECT 1")  # the notices sent before it are in
        await writer.close()
    headers = [notice_header(p) for p in payloads]
    assert [(h.task_id, h.state, h.cancel_requested, h.owner, h.origin) for h in headers if h] == [
        ("t1", "pending", False, None, ODD_HOST),
        ("t1", "running", False, "prov \\ one", ODD_HOST),
    ]
    rows = [h.task() for h in headers if h]
    assert [t.params["prompt"] for t in rows if t] == [posing, posing]
