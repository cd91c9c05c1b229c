"""SQLite backend (WAL) for one machine: the embedded default.

One connection, used from the event loop's thread; each write is its own
short transaction, so a crash loses at most the write in flight.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dispatcher.errors import StoreError
from dispatcher.models import Account, CacheEntry, Job, State, Task
from dispatcher.store.rows import (
    TASK_COLUMNS,
    encode_changes,
    row_to_account,
    row_to_cache_entry,
    row_to_task,
    task_to_row,
)
from dispatcher.store.schema import MIGRATIONS

_SELECT_TASK = f"SELECT {', '.join(TASK_COLUMNS)} FROM tasks"


class SqliteStore:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.writes: Counter[str] = Counter()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(
                self.path, isolation_level=None, check_same_thread=False, timeout=10
            )
            self._db.row_factory = sqlite3.Row
            self._db.execute("PRAGMA journal_mode=WAL")
            # NORMAL in WAL mode survives a process crash; only power loss may
            # drop the last commits, which reconciliation treats like a crash.
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute("PRAGMA foreign_keys=ON")
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open SQLite database {self.path}: {exc}") from exc
        self._lock = threading.RLock()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    yield self._db
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
                self._db.execute("COMMIT")
            except sqlite3.Error as exc:
                raise StoreError(f"SQLite write failed: {exc}") from exc

    def _query(self, sql: str, args: Sequence[Any] = ()) -> list[sqlite3.Row]:
        with self._lock:
            try:
                return self._db.execute(sql, args).fetchall()
            except sqlite3.Error as exc:
                raise StoreError(f"SQLite read failed: {exc}") from exc

    def migrate(self) -> None:
        with self._tx() as db:
            db.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
            row = db.execute("SELECT MAX(version) FROM schema_version").fetchone()
            current = row[0] or 0
            for version, statements in MIGRATIONS:
                if version <= current:
                    continue
                for statement in statements:
                    db.execute(statement)
                db.execute("INSERT INTO schema_version (version) VALUES (?)", (version,))

    def schema_version(self) -> int:
        return int(self._query("SELECT MAX(version) FROM schema_version")[0][0] or 0)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # -- tasks -------------------------------------------------------------
    def insert_tasks(self, tasks: Sequence[Task], job: Job | None = None) -> list[Task]:
        stored: list[Task] = []
        with self._tx() as db:
            if job is not None:
                db.execute(
                    "INSERT INTO jobs (id, name, created_at) VALUES (?, ?, ?)",
                    (job.id, job.name, job.created_at),
                )
            for task in tasks:
                row = task_to_row(task)
                columns = ", ".join(row)
                marks = ", ".join("?" for _ in row)
                cursor = db.execute(
                    f"INSERT INTO tasks ({columns}) VALUES ({marks})", tuple(row.values())
                )
                stored.append(task.replace(seq=cursor.lastrowid or 0))
                self.writes[task.id] += 1
        return stored

    def get_task(self, task_id: str) -> Task | None:
        rows = self._query(f"{_SELECT_TASK} WHERE id = ?", (task_id,))
        return row_to_task(rows[0]) if rows else None

    def update_task(
        self,
        task_id: str,
        *,
        expect_state: State,
        expect_attempt: int | None = None,
        changes: Mapping[str, Any],
    ) -> Task | None:
        columns = encode_changes(changes)
        sets = ", ".join(f"{name} = ?" for name in columns)
        sql = f"UPDATE tasks SET {sets} WHERE id = ? AND state = ?"
        args: list[Any] = [*columns.values(), task_id, expect_state.value]
        if expect_attempt is not None:
            sql += " AND attempt = ?"
            args.append(expect_attempt)
        with self._tx() as db:
            if db.execute(sql, args).rowcount != 1:
                return None
            row = db.execute(f"{_SELECT_TASK} WHERE id = ?", (task_id,)).fetchone()
        self.writes[task_id] += 1
        return row_to_task(row)

    def claim_next(
        self, lane_groups: Sequence[str], now: float, changes: Mapping[str, Any]
    ) -> Task | None:
        if not lane_groups:
            return None
        marks = ", ".join("?" for _ in lane_groups)
        columns = encode_changes({**changes, "state": State.RUNNING})
        sets = ", ".join(f"{name} = ?" for name in columns)
        with self._tx() as db:
            # Oldest first across the groups: FIFO within the lane.
            row = db.execute(
                f"SELECT id FROM tasks WHERE state = 'pending' AND lane_group IN ({marks}) "
                "AND not_before <= ? ORDER BY seq LIMIT 1",
                (*lane_groups, now),
            ).fetchone()
            if row is None:
                return None
            db.execute(
                f"UPDATE tasks SET {sets} WHERE id = ? AND state = 'pending'",
                (*columns.values(), row["id"]),
            )
            claimed = db.execute(f"{_SELECT_TASK} WHERE id = ?", (row["id"],)).fetchone()
        self.writes[claimed["id"]] += 1
        return row_to_task(claimed)

    def tasks_in_state(self, state: State, limit: int | None = None) -> list[Task]:
        sql = f"{_SELECT_TASK} WHERE state = ? ORDER BY seq"
        args: list[Any] = [state.value]
        if limit is not None:
            sql += " LIMIT ?"
            args.append(limit)
        return [row_to_task(r) for r in self._query(sql, args)]

    def stale_running(self, heartbeat_before: float) -> list[Task]:
        rows = self._query(
            f"{_SELECT_TASK} WHERE state = 'running' "
            "AND COALESCE(heartbeat_at, started_at, created_at) < ? ORDER BY seq",
            (heartbeat_before,),
        )
        return [row_to_task(r) for r in rows]

    def count_ahead(self, lane_group: str, seq: int) -> int:
        rows = self._query(
            "SELECT COUNT(*) FROM tasks WHERE state = 'pending' AND lane_group = ? AND seq < ?",
            (lane_group, seq),
        )
        return int(rows[0][0])

    def queued_counts(self) -> dict[str, int]:
        rows = self._query(
            "SELECT lane_group, COUNT(*) FROM tasks WHERE state = 'pending' GROUP BY lane_group"
        )
        return {r[0]: int(r[1]) for r in rows}

    def state_counts(self) -> dict[tuple[str, str], int]:
        rows = self._query("SELECT model, state, COUNT(*) FROM tasks GROUP BY model, state")
        return {(r[0], r[1]): int(r[2]) for r in rows}

    def recent_durations(self, model: str, limit: int = 20) -> list[float]:
        rows = self._query(
            "SELECT finished_at - started_at FROM tasks WHERE model = ? AND state = 'success' "
            "AND from_cache = 0 AND started_at IS NOT NULL AND finished_at IS NOT NULL "
            "ORDER BY finished_at DESC LIMIT ?",
            (model, limit),
        )
        return [float(r[0]) for r in rows]

    def find_by_fingerprint(self, fingerprint: str, created_since: float) -> Task | None:
        rows = self._query(
            f"{_SELECT_TASK} WHERE fingerprint = ? AND created_at >= ? "
            "AND state NOT IN ('failed', 'canceled') ORDER BY seq DESC LIMIT 1",
            (fingerprint, created_since),
        )
        return row_to_task(rows[0]) if rows else None

    # -- jobs ----------------------------------------------------------------
    def get_job(self, job_id: str) -> Job | None:
        rows = self._query("SELECT id, name, created_at FROM jobs WHERE id = ?", (job_id,))
        return Job(id=rows[0][0], name=rows[0][1], created_at=rows[0][2]) if rows else None

    def job_tasks(self, job_id: str) -> list[Task]:
        rows = self._query(f"{_SELECT_TASK} WHERE job_id = ? ORDER BY seq", (job_id,))
        return [row_to_task(r) for r in rows]

    def job_counts(self, job_id: str) -> dict[State, int]:
        rows = self._query(
            "SELECT state, COUNT(*) FROM tasks WHERE job_id = ? GROUP BY state", (job_id,)
        )
        return {State(r[0]): int(r[1]) for r in rows}

    def list_jobs(self, limit: int = 50) -> list[Job]:
        rows = self._query(
            "SELECT id, name, created_at FROM jobs ORDER BY created_at DESC LIMIT ?", (limit,)
        )
        return [Job(id=r[0], name=r[1], created_at=r[2]) for r in rows]

    # -- accounts ------------------------------------------------------------
    def get_accounts(self) -> dict[str, Account]:
        rows = self._query(
            "SELECT name, kind, enabled, reason, needs_attention, updated_at FROM accounts"
        )
        return {r["name"]: row_to_account(r) for r in rows}

    def upsert_account(self, account: Account) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT INTO accounts (name, kind, enabled, reason, needs_attention, updated_at) "
                "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (name) DO UPDATE SET "
                "kind = excluded.kind, enabled = excluded.enabled, reason = excluded.reason, "
                "needs_attention = excluded.needs_attention, updated_at = excluded.updated_at",
                (
                    account.name,
                    account.kind.value,
                    int(account.enabled),
                    account.reason,
                    int(account.needs_attention),
                    account.updated_at,
                ),
            )

    # -- result cache index ----------------------------------------------------
    def cache_get(self, fingerprint: str) -> CacheEntry | None:
        rows = self._query("SELECT * FROM cache_entries WHERE fingerprint = ?", (fingerprint,))
        return row_to_cache_entry(rows[0]) if rows else None

    def cache_put(self, entry: CacheEntry) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT INTO cache_entries (fingerprint, model, result, size_bytes, created_at, "
                "last_used_at) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (fingerprint) DO UPDATE SET "
                "model = excluded.model, result = excluded.result, "
                "size_bytes = excluded.size_bytes, created_at = excluded.created_at, "
                "last_used_at = excluded.last_used_at",
                (
                    entry.fingerprint,
                    entry.model,
                    json.dumps(entry.result),
                    entry.size_bytes,
                    entry.created_at,
                    entry.last_used_at,
                ),
            )

    def cache_touch(self, fingerprint: str, last_used_at: float) -> None:
        with self._tx() as db:
            db.execute(
                "UPDATE cache_entries SET last_used_at = ? WHERE fingerprint = ?",
                (last_used_at, fingerprint),
            )

    def cache_delete(self, fingerprint: str) -> None:
        with self._tx() as db:
            db.execute("DELETE FROM cache_entries WHERE fingerprint = ?", (fingerprint,))

    def cache_entries(self) -> list[CacheEntry]:
        return [
            row_to_cache_entry(r)
            for r in self._query("SELECT * FROM cache_entries ORDER BY last_used_at")
        ]
