"""The task notices on a real PostgreSQL database: which writes send one, and who wrote it."""

from __future__ import annotations

import asyncio

from dispatcher.models import Kind, State, Task
from dispatcher.store import open_store
from dispatcher.store.pglisten import TaskListener, TaskNotice, parse_notice
from tests.support.pgdb import fresh_database

ODD_HOST = "rack 2\\node 7"  # a space and a backslash: escaped in the connection options


def _task(task_id: str) -> Task:
    return Task(
        id=task_id,
        model="m",
        kind=Kind.API,
        queue="g",
        params={"prompt": task_id},
        fingerprint=f"fp-{task_id}",
        created_at=1.0,
    )


def test_a_notice_reads_back_with_a_host_holding_spaces() -> None:
    assert parse_notice("t1 running 1 rack 2 node") == TaskNotice(
        "t1", "running", True, "rack 2 node"
    )
    assert parse_notice("t1 pending 0") == TaskNotice("t1", "pending", False, "")
    assert parse_notice("garbage") is None


async def test_inserts_state_changes_and_cancels_are_heard_by_other_hosts_only() -> None:
    with fresh_database() as url:
        writer = await open_store(url, ODD_HOST)
        heard: asyncio.Queue[TaskNotice] = asyncio.Queue()
        other = TaskListener(url, "listener-host", heard.put_nowait)
        itself = TaskListener(url, ODD_HOST, heard.put_nowait)
        await other.start()
        await itself.start()
        try:
            await writer.insert_tasks([_task("t1")])
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
            assert got == [
                TaskNotice("t1", "pending", False, ODD_HOST),
                TaskNotice("t1", "running", False, ODD_HOST),
                TaskNotice("t1", "running", True, ODD_HOST),
                TaskNotice("t1", "canceled", True, ODD_HOST),
            ]
            # The writer's own listener heard nothing of it.
            assert itself.received == 0 and other.received == 4
        finally:
            await other.aclose()
            await itself.aclose()
            await writer.close()
