"""A database left by the previous version, with rows in it, upgrades and keeps them.

The previous schema is built by its own migration files (every one but the
last of each dialect), and its rows are written with the column names it had:
0.1 named a task's queue `lane_group` and its owner `account`.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

import psycopg
import pytest

from dispatcher.models import State
from dispatcher.store import open_store
from dispatcher.store.migrations import latest_version, migrations
from tests.support.pgdb import fresh_database

# The last version of each dialect before the queue/owner rename.
BEFORE_RENAME = {"sqlite": 9, "postgresql": 5}

JOB = "INSERT INTO jobs (id, name, created_at) VALUES (?, ?, ?)"
TASK = (
    "INSERT INTO tasks (id, job_id, model, kind, lane_group, account, params, fingerprint, "
    "state, attempt, max_attempts, created_at, started_at, heartbeat_at, host) "
    "VALUES (?, ?, 'm', 'api', ?, ?, '{\"prompt\": \"kept\"}', ?, ?, 1, 3, ?, ?, ?, ?)"
)
ATTEMPT = (
    "INSERT INTO attempts (task_id, attempt, lane_group, account, outcome, started_at, ended_at) "
    "VALUES (?, 1, ?, ?, 'pending', 1.0, 2.0)"
)
# id, queue, owner, fingerprint, state, created_at, started_at, heartbeat_at, host
TASKS = [
    ("old-running", "api-model:m", "prov", "fp-r", "running", 1.0, 3.0, 3.0, "h1"),
    ("old-pending-1", "api-model:m", None, "fp-p1", "pending", 2.0, None, None, None),
    ("old-pending-2", "api-model:m", None, "fp-p2", "pending", 4.0, None, None, None),
]


def _old_statements(dialect: str) -> list[str]:
    previous = [m for m in migrations(dialect) if m.version <= BEFORE_RENAME[dialect]]
    assert [m.version for m in previous] == list(range(1, BEFORE_RENAME[dialect] + 1))
    return [statement for m in previous for statement in m.statements]


def _fill(run: Callable[[str, tuple[object, ...]], object], mark: str) -> None:
    """The rows, through a connection's `execute`, in its placeholders."""
    run(JOB.replace("?", mark), ("old-job", "a batch of 0.1", 1.0))
    for task_id, queue, owner, fp, state, created, started, beat, host in TASKS:
        run(
            TASK.replace("?", mark),
            (task_id, "old-job", queue, owner, fp, state, created, started, beat, host),
        )
    run(ATTEMPT.replace("?", mark), ("old-running", "api-model:m", "prov"))


def _sqlite_before(path: Path) -> str:
    db = sqlite3.connect(path)
    try:
        db.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
        for statement in _old_statements("sqlite"):
            db.execute(statement)
        db.executemany(
            "INSERT INTO schema_version (version) VALUES (?)",
            [(v,) for v in range(1, BEFORE_RENAME["sqlite"] + 1)],
        )
        _fill(db.execute, "?")
        db.commit()
    finally:
        db.close()
    return f"sqlite:///{path}"


def _postgresql_before(url: str) -> str:
    with psycopg.connect(url) as conn:
        conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
        for statement in _old_statements("postgresql"):
            conn.execute(statement)
        for version in range(1, BEFORE_RENAME["postgresql"] + 1):
            conn.execute("INSERT INTO schema_version (version) VALUES (%s)", (version,))
        _fill(conn.execute, "%s")
    return url


@pytest.mark.parametrize("dialect", ["sqlite", "postgresql"])
async def test_a_database_of_the_previous_version_upgrades_with_its_rows(
    dialect: str, tmp_path: Path
) -> None:
    with fresh_database() if dialect == "postgresql" else nullcontext("") as pg_url:
        url = (
            _sqlite_before(tmp_path / "old.db")
            if dialect == "sqlite"
            else _postgresql_before(pg_url)
        )
        store = await open_store(url, "h1")
        try:
            assert await store.schema_version() == latest_version(dialect)
            # The rows are all there, their queue and owner under the new names.
            running = await store.get_task("old-running")
            assert running is not None
            assert (running.queue, running.owner, running.state) == (
                "api-model:m",
                "prov",
                State.RUNNING,
            )
            assert running.params == {"prompt": "kept"} and running.job_id == "old-job"
            (attempt,) = await store.task_attempts("old-running")
            assert (attempt.queue, attempt.owner, attempt.outcome) == (
                "api-model:m",
                "prov",
                State.PENDING,
            )
            job = await store.get_job("old-job")
            assert job is not None and job.name == "a batch of 0.1"
            # And the queue still works on them: positions, owners, FIFO claim.
            second = await store.get_task("old-pending-2")
            assert second is not None
            assert await store.count_ahead("api-model:m", second.seq) == 1
            assert await store.queued_counts() == {"api-model:m": 2}
            assert await store.running_owners("api-model:m") == 1
            claimed = await store.claim_next(["api-model:m"], 10.0, {"owner": "prov-b"})
            assert claimed is not None and claimed.id == "old-pending-1"
            assert claimed.owner == "prov-b"
            assert await store.running_owners("api-model:m") == 2
        finally:
            await store.close()
