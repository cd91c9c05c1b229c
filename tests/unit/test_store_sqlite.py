from __future__ import annotations

import re
import sqlite3
from pathlib import Path

from dispatcher.models import Account, Job, Kind, State, Task
from dispatcher.store.migrations import latest_version
from dispatcher.store.sqlite import SqliteStore

SCHEMA_SQL = (
    Path(__file__).resolve().parents[2]
    / "dispatcher"
    / "store"
    / "migrations"
    / "sqlite_schema.sql"
)


def _schema(db: sqlite3.Connection) -> dict[str, str]:
    rows = db.execute(
        "SELECT name, sql FROM sqlite_master WHERE sql IS NOT NULL "
        "AND name NOT IN ('schema_version', 'sqlite_sequence')"
    ).fetchall()
    return {
        name: re.sub(r"\s+", " ", sql).replace("( ", "(").replace(" )", ")").strip()
        for name, sql in rows
    }


def _columns(db: sqlite3.Connection) -> dict[str, list[tuple[str, str, int, object]]]:
    tables = [
        r[0]
        for r in db.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' "
            "AND name NOT IN ('schema_version', 'sqlite_sequence')"
        )
    ]
    return {
        t: [(c[1], c[2], c[3], c[4]) for c in db.execute(f"PRAGMA table_info({t})")] for t in tables
    }


async def test_migrations_reproduce_the_documented_schema(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "migrated.db")
    await store.migrate()
    await store.close()
    migrated = sqlite3.connect(tmp_path / "migrated.db")
    documented = sqlite3.connect(tmp_path / "documented.db")
    documented.executescript(SCHEMA_SQL.read_text())
    assert _columns(migrated) == _columns(documented)
    migrated_indexes = {k for k in _schema(migrated) if not k.startswith("sqlite_autoindex")}
    documented_indexes = {k for k in _schema(documented) if not k.startswith("sqlite_autoindex")}
    assert migrated_indexes == documented_indexes
    migrated.close()
    documented.close()


async def test_migrate_is_idempotent_and_uses_wal(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "d.db")
    await store.migrate()
    await store.migrate()
    assert await store.schema_version() == latest_version("sqlite") == 13
    mode = store._db.execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"
    await store.close()


def _task(task_id: str, group: str = "api:p", **changes: object) -> Task:
    return Task(
        id=task_id,
        model="m",
        kind=Kind.API,
        queue=group,
        params={"prompt": "x"},
        fingerprint="fp-" + task_id,
        created_at=1.0,
    ).replace(**changes)


async def test_update_is_compare_and_set_on_state_and_attempt(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "d.db")
    await store.migrate()
    await store.insert_tasks([_task("a")])
    moved = await store.update_task(
        "a", expect_state=State.PENDING, expect_attempt=1, changes={"state": State.RUNNING}
    )
    assert moved is not None and moved.state is State.RUNNING
    # A writer still believing the task is pending loses.
    assert (
        await store.update_task("a", expect_state=State.PENDING, changes={"state": State.CANCELED})
        is None
    )
    # A late writer from an older attempt loses too.
    assert (
        await store.update_task(
            "a", expect_state=State.RUNNING, expect_attempt=0, changes={"state": State.SUCCESS}
        )
        is None
    )
    assert (await store.get_task("a")).state is State.RUNNING  # type: ignore[union-attr]
    await store.close()


async def test_claim_takes_the_oldest_ready_task_of_its_groups(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "d.db")
    await store.migrate()
    await store.insert_tasks(
        [
            _task("later-retry", not_before=50.0),
            _task("other-lane", group="api:q"),
            _task("first"),
            _task("second"),
        ]
    )
    claimed = await store.claim_next(["api:p"], now=10.0, changes={"owner": "p"})
    assert claimed is not None and claimed.id == "first" and claimed.state is State.RUNNING
    assert (await store.claim_next(["api:p"], now=10.0, changes={})).id == "second"  # type: ignore[union-attr]
    assert await store.claim_next(["api:p"], now=10.0, changes={}) is None
    assert (await store.claim_next(["api:p"], now=60.0, changes={})).id == "later-retry"  # type: ignore[union-attr]
    await store.close()


async def test_job_counts_and_accounts_persist(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "d.db")
    await store.migrate()
    await store.insert_tasks(
        [_task("a", job_id="j"), _task("b", job_id="j")], Job("j", "batch", 1.0)
    )
    await store.update_task("a", expect_state=State.PENDING, changes={"state": State.CANCELED})
    assert await store.job_counts("j") == {State.PENDING: 1, State.CANCELED: 1}
    await store.upsert_account(Account("acct-1", Kind.WEB, enabled=False, reason="captcha"))
    await store.close()
    reopened = SqliteStore(tmp_path / "d.db")
    await reopened.migrate()
    account = (await reopened.get_accounts())["acct-1"]
    assert (account.enabled, account.reason) == (False, "captcha")
    await reopened.close()


def _sql_ahead(store: SqliteStore, group: str, seq: int) -> int:
    rows = store._db.execute(
        "SELECT COUNT(*) FROM tasks WHERE state = 'pending' AND queue = ? AND seq < ?",
        (group, seq),
    ).fetchall()
    return int(rows[0][0])


async def test_queue_positions_follow_every_write_and_survive_a_reopen(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "d.db")
    await store.migrate()
    tasks = await store.insert_tasks(
        [_task(f"t{i}", group="api:q" if i % 3 else "api:p") for i in range(9)]
    )
    seqs = {t.id: t.seq for t in tasks}
    assert await store.count_ahead("api:q", seqs["t5"]) == 3  # t1, t2, t4
    assert await store.queued_counts() == {"api:p": 3, "api:q": 6}
    await store.claim_next(["api:q"], now=10.0, changes={})  # t1 leaves the queue
    await store.update_task("t2", expect_state=State.PENDING, changes={"state": State.CANCELED})
    assert await store.count_ahead("api:q", seqs["t5"]) == 1
    # Back to pending (a retry): the task keeps its place by seq.
    await store.update_task(
        "t2", expect_state=State.CANCELED, changes={"state": State.PENDING, "attempt": 2}
    )
    assert await store.count_ahead("api:q", seqs["t5"]) == 2
    # A refused CAS changes nothing.
    assert (
        await store.update_task("t1", expect_state=State.PENDING, changes={"state": State.CANCELED})
        is None
    )
    for task in tasks:
        assert await store.count_ahead(task.queue, task.seq) == _sql_ahead(
            store, task.queue, task.seq
        )
    counts = await store.queued_counts()
    await store.close()
    reopened = SqliteStore(tmp_path / "d.db")
    await reopened.migrate()
    assert await reopened.queued_counts() == counts
    for task in tasks:
        assert await reopened.count_ahead(task.queue, task.seq) == _sql_ahead(
            reopened, task.queue, task.seq
        )
    await reopened.close()


async def test_write_counts_are_kept_for_recent_tasks_only(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "d.db")
    await store.migrate()
    store.writes.generation = 3  # keeps the last 3 to 6 ids written
    await store.insert_tasks([_task(f"t{i}") for i in range(5)])
    await store.update_task("t4", expect_state=State.PENDING, changes={"state": State.CANCELED})
    assert dict(store.writes) == {"t0": 1, "t1": 1, "t2": 1, "t3": 1, "t4": 2}
    await store.update_task("t0", expect_state=State.PENDING, changes={"state": State.CANCELED})
    await store.insert_tasks([_task("t5")])
    assert dict(store.writes) == {"t3": 1, "t4": 2, "t0": 2, "t5": 1}
    assert store.writes["t1"] == 0 and "t1" not in store.writes  # forgotten, not an error
    await store.close()


async def test_cas_can_require_that_nobody_asked_to_cancel(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "d.db")
    await store.migrate()
    await store.insert_tasks([_task("a", state=State.RUNNING, cancel_requested=True)])
    done = {"state": State.SUCCESS}
    assert (
        await store.update_task(
            "a", expect_state=State.RUNNING, changes=done, unless_cancel_requested=True
        )
        is None
    )
    assert await store.update_task("a", expect_state=State.RUNNING, changes=done) is not None
    await store.close()


async def test_a_plain_queue_is_claimed_in_index_order_without_sorting_it(tmp_path: Path) -> None:
    """Issue 30: the claim sorts a queue by priority and deadline only when one
    of its pending tasks has either, known from a partial index, not a scan."""
    from dispatcher.store.sql import claim_sql, ranked_sql

    store = SqliteStore(tmp_path / "d.db")
    await store.migrate()
    db = store._db
    ranked = " ".join(
        str(row[3])
        for row in db.execute(
            "EXPLAIN QUERY PLAN " + ranked_sql(1, hint="INDEXED BY tasks_ranked"), ["g"]
        )
    )
    assert "tasks_ranked" in ranked
    plain = claim_sql(1, {"state": "running"}, fenced=False, quota=False, lock="", ranked=False)
    steps = " ".join(
        str(row[3]) for row in db.execute("EXPLAIN QUERY PLAN " + plain, ["r", "g", 1])
    )
    assert "tasks_queue" in steps and "TEMP B-TREE" not in steps
    await store.close()
