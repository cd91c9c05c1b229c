"""SQLite backend (WAL) for one machine: the embedded default.

One connection, used from the event loop's thread. Every write has committed
when it returns, so a crash loses at most the write in flight: a write that is
one statement runs on its own in autocommit (atomic, and as durable as an
explicit transaction, without the BEGIN/COMMIT round trips), writes of several
statements share one transaction.

Queue positions (`count_ahead`, asked for by every answer about a pending
task) come from memory: the seqs of pending tasks per queue, sorted,
loaded by `migrate` and kept up to date by the writes here. Counting them in
SQL cost a scan of the queue per answer. Only this process writes the
database while it runs (the service holds the state dir's lock), so the copy
cannot drift.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dispatcher.errors import StoreError
from dispatcher.models import (
    Account,
    Attempt,
    Job,
    JobState,
    JobSummary,
    State,
    Task,
)
from dispatcher.pricing import AGING_STEP_S, Budget
from dispatcher.store.base import (
    EndedAndClaimed,
    InsertedAndClaimed,
    NextClaim,
    TaskWrite,
    TaskWriter,
)
from dispatcher.store.beats import Heartbeat
from dispatcher.store.cacheindex import CacheIndex
from dispatcher.store.cachesql import SqliteCacheIndex
from dispatcher.store.hosts import Fence, Quota
from dispatcher.store.migrations import migrations
from dispatcher.store.outbox import SqlOutbox, WebhookOutbox
from dispatcher.store.rows import (
    row_to_account,
    row_to_attempt,
    row_to_task,
    task_to_row,
)
from dispatcher.store.sql import (
    ACCOUNT_UPSERT,
    ACCOUNTS,
    COST_BY_PROVIDER,
    FALLBACKS_WAITING,
    GENERATIONS,
    ID_TABLES,
    JOB_MODEL_COUNTS,
    LATE_SQL,
    RECENT_DURATIONS,
    SELECT_TASK,
    SPENT,
    STALE_RUNNING,
    TWIN,
    WEB_ACCOUNT_PUT,
    WEB_ACCOUNTS,
    account_args,
    cheapest_ready_sql,
    insert_sql,
    list_jobs_sql,
    list_tasks_where,
)
from dispatcher.store.sqlite_hosts import SqliteHostOps
from dispatcher.store.sqlite_index import PendingIndex, WriteCounter
from dispatcher.store.taskwrites import (
    SQLITE,
    Statement,
    TaskUpdate,
    ranked_query,
    task_claim,
    task_update,
)

# SQLite without statistics would scan the tasks rather than use the partial index.
_FALLBACKS = FALLBACKS_WAITING.format(hint="INDEXED BY tasks_fallback")


class SqliteStore(SqliteHostOps, TaskWriter):
    """The `Store` on one SQLite file.

    Its coroutines run the SQLite calls inline, without a thread hop: the
    file is local and a statement takes microseconds, while a hop to a worker
    thread and back costs tens of them per call and a dispatch makes several
    calls; dispatch throughput is a benchmarked target (BENCHMARKS.md). So an
    await here never yields to the loop, and callers see the same
    interleaving as when these calls were synchronous.
    """

    claims_on_insert = False  # no round trip to save (`insert_and_claim`)

    def __init__(self, path: str | Path, host: str = "") -> None:
        self.path = Path(path)
        self.host = host
        self.writes = WriteCounter()
        self._pending = PendingIndex()
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
        self._cache_index = SqliteCacheIndex(self._db, self._lock, host, self._tx)
        self._outbox = SqlOutbox(self._outbox_run, self._outbox_batch, lock="")

    @property
    def cache_index(self) -> CacheIndex:
        return self._cache_index

    @property
    def webhook_outbox(self) -> WebhookOutbox:
        return self._outbox

    async def _outbox_run(self, sql: str, args: Sequence[Any]) -> list[Any]:
        return self._write1(sql, args)

    async def _outbox_batch(self, sql: str, many: Sequence[Sequence[Any]]) -> None:
        with self._tx() as db:
            db.executemany(sql, many)

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    yield self._db
                    # The cache's pending puts share this commit.
                    puts = self._cache_index.ride(self._db)
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
                self._db.execute("COMMIT")
            except sqlite3.Error as exc:
                raise StoreError(f"SQLite write failed: {exc}") from exc
            self._cache_index.written(puts)

    def _query(
        self, sql: str, args: Sequence[Any] = (), *, what: str = "read"
    ) -> list[sqlite3.Row]:
        with self._lock:
            try:
                return self._db.execute(sql, args).fetchall()
            except sqlite3.Error as exc:
                raise StoreError(f"SQLite {what} failed: {exc}") from exc

    def _write1(self, sql: str, args: Sequence[Any] = ()) -> list[sqlite3.Row]:
        """One write statement in autocommit: committed once its rows are read."""
        return self._query(sql, args, what="write")

    async def migrate(self) -> None:
        with self._tx() as db:
            db.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
            row = db.execute("SELECT MAX(version) FROM schema_version").fetchone()
            current = row[0] or 0
            for migration in migrations("sqlite"):
                if migration.version <= current:
                    continue
                for statement in migration.statements:
                    db.execute(statement)
                db.execute("INSERT INTO schema_version (version) VALUES (?)", (migration.version,))
        pending = PendingIndex()
        for row in self._query("SELECT queue, seq FROM tasks WHERE state = 'pending' ORDER BY seq"):
            pending.add(row["queue"], row["seq"])
        self._pending = pending

    async def schema_version(self) -> int:
        return int(self._query("SELECT MAX(version) FROM schema_version")[0][0] or 0)

    async def close(self) -> None:
        with self._lock:
            try:
                self._cache_index.close()
            finally:
                self._db.close()

    # -- tasks -------------------------------------------------------------
    async def insert_tasks(self, tasks: Sequence[Task], job: Job | None = None) -> list[Task]:
        rows = [task_to_row(task) for task in tasks]
        with self._lock:
            if job is None and len(rows) == 1:
                # The common case (one POST, one task): one statement, no transaction.
                (stored_row,) = self._write1(
                    insert_sql(rows[0], "?", "seq"), tuple(rows[0].values())
                )
                seqs = [int(stored_row[0])]
            else:
                seqs = []
                with self._tx() as db:
                    if job is not None:
                        db.execute(
                            "INSERT INTO jobs (id, name, created_at) VALUES (?, ?, ?)",
                            (job.id, job.name, job.created_at),
                        )
                    for row in rows:
                        (stored_row,) = db.execute(
                            insert_sql(row, "?", "seq"), tuple(row.values())
                        ).fetchall()
                        seqs.append(int(stored_row[0]))
            stored = [task.replace(seq=seq) for task, seq in zip(tasks, seqs, strict=True)]
            for task in stored:
                self.writes.add(task.id)
                if task.state is State.PENDING:
                    self._pending.add(task.queue, task.seq)
        return stored

    async def get_task(self, task_id: str) -> Task | None:
        rows = self._query(f"{SELECT_TASK} WHERE id = ?", (task_id,))
        return row_to_task(rows[0]) if rows else None

    async def get_tasks(self, task_ids: Sequence[str]) -> list[Task]:
        if not task_ids:
            return []
        marks = ", ".join("?" for _ in task_ids)
        rows = self._query(f"{SELECT_TASK} WHERE id IN ({marks}) ORDER BY seq", tuple(task_ids))
        return [row_to_task(r) for r in rows]

    async def write_task(self, write: TaskWrite) -> Task | None:
        statements = task_update(SQLITE, write)
        with self._lock:
            if statements.history is None:
                rows = self._write1(statements.update.sql, statements.update.args)
            else:
                with self._tx() as db:
                    rows = _end(db, statements)
            return self._wrote(write, rows)

    async def insert_and_claim(
        self, task: Task, created_since: float, claim: NextClaim
    ) -> InsertedAndClaimed | None:
        # In-process, the insert and the scheduler's claim after it cost no
        # round trip: nothing to save.
        return None

    async def finish_and_claim(self, write: TaskWrite, claim: NextClaim) -> EndedAndClaimed | None:
        # No round trip to save in-process, but commits: the end, its history
        # row and the claim in one transaction are one write to the WAL, not
        # two (and the refill's claim is not made again after it).
        if not claim.queues:
            return None
        statements = task_update(SQLITE, write)
        with self._lock:
            claiming = await self._claim_statement(claim)
            with self._tx() as db:
                # The end first: the claim (its quota count included) sees
                # the slot it freed.
                rows = _end(db, statements)
                claimed = db.execute(claiming.sql, claiming.args).fetchall()
            return EndedAndClaimed(self._wrote(write, rows), self._took(claimed))

    def _wrote(self, write: TaskWrite, rows: Sequence[sqlite3.Row]) -> Task | None:
        """The task as `write` left it (None: refused), kept in the indexes."""
        if not rows:
            return None
        self.writes.add(write.task_id)
        self._pending.track(write.expect_state.value, rows[0])
        return row_to_task(rows[0])

    def _took(self, rows: Sequence[sqlite3.Row]) -> Task | None:
        """The task a claim took (None: none), kept in the indexes."""
        if not rows:
            return None
        claimed = rows[0]
        self.writes.add(claimed["id"])
        self._pending.discard(claimed["queue"], claimed["seq"])
        return row_to_task(claimed)

    async def _claim_statement(self, claim: NextClaim) -> Statement:
        """The claim as one statement; what it is not told, read first."""
        fallbacks, ranked = claim.fallbacks, claim.ranked
        if fallbacks is None:
            fallbacks = await self.fallbacks_waiting()
        if ranked is None:
            ranked = await self.ranked_waiting(claim.queues)
        return task_claim(
            SQLITE,
            claim.queues,
            claim.now,
            claim.changes,
            fence=claim.fence,
            quota=claim.quota,
            budget=claim.budget,
            ranked=ranked,
            fallbacks=fallbacks,
            prefer=claim.prefer,
            aging_step_s=claim.aging_step_s,
        )

    async def heartbeat_tasks(self, beats: Sequence[Heartbeat]) -> list[Task | None]:
        # In-process: nothing to batch; each beat is `update_task`'s write.
        return [
            await self.update_task(
                beat.task_id,
                expect_state=State.RUNNING,
                expect_attempt=beat.attempt,
                changes={"heartbeat_at": beat.at, "stage": beat.stage},
                fence=beat.fence,
            )
            for beat in beats
        ]

    async def claim_next(
        self,
        queues: Sequence[str],
        now: float,
        changes: Mapping[str, Any],
        *,
        fence: Fence | None = None,
        quota: Quota | None = None,
        budget: Budget | None = None,
        aging_step_s: float = AGING_STEP_S,
        prefer: Sequence[str] = (),
        ranked: bool | None = None,
        fallbacks: bool | None = None,
    ) -> Task | None:
        if not queues:
            return None
        claim = NextClaim(
            tuple(queues),
            now,
            changes,
            fence=fence,
            quota=quota,
            budget=budget,
            aging_step_s=aging_step_s,
            prefer=tuple(prefer),
            ranked=ranked,
            fallbacks=fallbacks,
        )
        with self._lock:
            statement = await self._claim_statement(claim)
            # Find and take in one statement (atomic on its own, budget check
            # included): the first ready task across the queues, in queue order.
            return self._took(self._write1(statement.sql, statement.args))

    async def task_attempts(self, task_id: str) -> list[Attempt]:
        rows = self._query("SELECT * FROM attempts WHERE task_id = ? ORDER BY id", (task_id,))
        return [row_to_attempt(r) for r in rows]

    async def list_tasks(
        self,
        *,
        states: Sequence[State] = (),
        model: str | None = None,
        job_id: str | None = None,
        text: str | None = None,
        before_seq: int | None = None,
        limit: int = 50,
        ref: str | None = None,
        after_seq: int | None = None,
        oldest_first: bool = False,
    ) -> list[Task]:
        where, args = list_tasks_where(
            [State(x).value for x in states], model, job_id, text, before_seq, ref, after_seq
        )
        order = "ASC" if oldest_first else "DESC"
        rows = self._query(f"{SELECT_TASK}{where} ORDER BY seq {order} LIMIT ?", (*args, limit))
        return [row_to_task(r) for r in rows]

    async def ids_with_prefix(self, table: str, prefix: str, limit: int = 10) -> list[str]:
        if table not in ID_TABLES:
            raise ValueError(f"no ids in table {table!r}")
        # A range on the primary key (an index seek); GLOB or LIKE would need
        # their wildcards escaped and LIKE ignores case.
        rows = self._query(
            f"SELECT id FROM {table} WHERE id >= ? AND id < ? ORDER BY id LIMIT ?",
            (prefix, prefix + "\U0010ffff", limit),
        )
        return [r[0] for r in rows]

    async def tasks_in_state(
        self, state: State, limit: int | None = None, *, host: str | None = None
    ) -> list[Task]:
        sql = f"{SELECT_TASK} WHERE state = ?"
        args: list[Any] = [state.value]
        if host is not None:
            sql += " AND host = ?"
            args.append(host)
        sql += " ORDER BY seq"
        if limit is not None:
            sql += " LIMIT ?"
            args.append(limit)
        return [row_to_task(r) for r in self._query(sql, args)]

    async def stale_running(self, heartbeat_before: float) -> list[Task]:
        rows = self._query(STALE_RUNNING, (heartbeat_before,))
        return [row_to_task(r) for r in rows]

    async def count_ahead(self, queue: str, seq: int) -> int:
        return self._pending.ahead(queue, seq)

    async def queue_place(self, queue: str, seq: int, *, owners: bool) -> tuple[int, int]:
        return self._pending.ahead(queue, seq), (await self.running_owners(queue) if owners else 0)

    async def running_owners(self, queue: str) -> int:
        rows = self._query(
            "SELECT COUNT(DISTINCT owner) FROM tasks WHERE state = 'running' AND queue = ?",
            (queue,),
        )
        return int(rows[0][0])

    async def queued_counts(self) -> dict[str, int]:
        return self._pending.counts()

    async def state_counts(self) -> dict[tuple[str, str], int]:
        rows = self._query("SELECT model, state, COUNT(*) FROM tasks GROUP BY model, state")
        return {(r[0], r[1]): int(r[2]) for r in rows}

    async def recent_durations(self, model: str, limit: int = 20) -> list[float]:
        rows = self._query(RECENT_DURATIONS, (model, limit))
        return [float(r[0]) for r in rows]

    async def find_by_fingerprint(self, fingerprint: str, created_since: float) -> Task | None:
        rows = self._query(TWIN, (fingerprint, created_since))
        return row_to_task(rows[0]) if rows else None

    async def insert_unless_twin(self, task: Task, created_since: float) -> tuple[Task, bool]:
        # No transaction needed: this process is the only writer, and nothing
        # runs between the look and the insert (no await, the lock held).
        row = task_to_row(task)
        with self._lock:
            found = self._query(TWIN, (task.fingerprint, created_since))
            if found:
                return row_to_task(found[0]), False
            (stored_row,) = self._write1(insert_sql(row, "?", "seq"), tuple(row.values()))
            stored = task.replace(seq=int(stored_row[0]))
            self.writes.add(stored.id)
            if stored.state is State.PENDING:
                self._pending.add(stored.queue, stored.seq)
        return stored, True

    # -- jobs ----------------------------------------------------------------
    async def get_job(self, job_id: str) -> Job | None:
        rows = self._query("SELECT id, name, created_at, rowid FROM jobs WHERE id = ?", (job_id,))
        if not rows:
            return None
        return Job(id=rows[0][0], name=rows[0][1], created_at=rows[0][2], seq=rows[0][3])

    async def job_tasks(self, job_id: str) -> list[Task]:
        rows = self._query(f"{SELECT_TASK} WHERE job_id = ? ORDER BY seq", (job_id,))
        return [row_to_task(r) for r in rows]

    async def job_counts(self, job_id: str) -> dict[State, int]:
        rows = self._query(
            "SELECT state, COUNT(*) FROM tasks WHERE job_id = ? GROUP BY state", (job_id,)
        )
        return {State(r[0]): int(r[1]) for r in rows}

    async def job_model_counts(self, job_id: str) -> dict[tuple[str, State], int]:
        rows = self._query(JOB_MODEL_COUNTS, (job_id,))
        return {(r[0], State(r[1])): int(r[2]) for r in rows}

    async def list_jobs(
        self,
        *,
        states: Sequence[JobState] = (),
        text: str | None = None,
        before_seq: int | None = None,
        limit: int = 50,
    ) -> list[Job]:
        sql, args = list_jobs_sql(
            [JobState(x).value for x in states], text, before_seq, seq_column="rowid"
        )
        rows = self._query(sql, (*args, limit))
        return [Job(id=r[0], name=r[1], created_at=r[2], seq=r[3]) for r in rows]

    async def job_summaries(
        self, job_ids: Sequence[str], now: float | None = None
    ) -> dict[str, JobSummary]:
        summaries = {job_id: JobSummary(counts={}) for job_id in job_ids}
        if not summaries:
            return summaries
        marks = ", ".join("?" for _ in summaries)
        rows = self._query(
            "SELECT job_id, state, COUNT(*), SUM(from_cache), MAX(finished_at), SUM(cost), "
            f"{LATE_SQL} FROM tasks WHERE job_id IN ({marks}) GROUP BY job_id, state",
            (-1.0 if now is None else now, *summaries),
        )
        for job_id, state, count, cached, finished, usd, late in rows:
            summary = summaries[job_id]
            summary.counts[State(state)] = int(count)
            summary.from_cache += int(cached or 0)
            summary.cost_usd += float(usd or 0.0)
            summary.late += int(late or 0)
            if finished is not None and (
                summary.last_finished_at is None or finished > summary.last_finished_at
            ):
                summary.last_finished_at = float(finished)
        return summaries

    async def cheapest_ready(self, queues: Sequence[str], now: float) -> float | None:
        if not queues:
            return None
        value = self._query(cheapest_ready_sql(len(queues)), (*queues, now))[0][0]
        return None if value is None else float(value)

    async def spent_since(self, provider: str, since: float) -> float:
        return float(self._query(SPENT, (provider, since))[0][0] or 0.0)

    async def ranked_waiting(self, queues: Sequence[str]) -> bool:
        found = ranked_query(SQLITE, queues)
        return bool(queues) and bool(self._query(found.sql, found.args))

    async def fallbacks_waiting(self) -> bool:
        return bool(self._query(_FALLBACKS))

    async def generations_since(self, owner: str, since: float) -> int:
        return int(self._query(GENERATIONS, (owner, since, owner, since))[0][0] or 0)

    async def cost_by_provider(self) -> dict[str, float]:
        rows = self._query(COST_BY_PROVIDER)
        return {r["owner"]: float(r["usd"] or 0.0) for r in rows}

    # -- accounts ------------------------------------------------------------
    async def delete_account(self, name: str) -> None:
        self._write1("DELETE FROM accounts WHERE name = ?", (name,))

    async def get_web_accounts(self) -> dict[str, tuple[str, ...]]:
        rows = self._query(WEB_ACCOUNTS)
        return {r["name"]: tuple(json.loads(r["models"])) for r in rows}

    async def put_web_account(self, name: str, models: Sequence[str], added_at: float) -> None:
        self._write1(WEB_ACCOUNT_PUT, (name, json.dumps(sorted(models)), added_at))

    async def delete_web_account(self, name: str) -> None:
        self._write1("DELETE FROM web_accounts WHERE name = ?", (name,))

    async def get_accounts(self) -> dict[str, Account]:
        rows = self._query(ACCOUNTS)
        return {r["name"]: row_to_account(r) for r in rows}

    async def upsert_account(self, account: Account) -> None:
        self._write1(ACCOUNT_UPSERT, account_args(account))


def _end(db: sqlite3.Connection, statements: TaskUpdate) -> list[sqlite3.Row]:
    """A compare-and-set write, its history row only if it matched (the
    caller's transaction holds both)."""
    rows = db.execute(statements.update.sql, statements.update.args).fetchall()
    if rows and statements.history is not None:
        db.execute(statements.history.sql, statements.history.args)
    return rows
