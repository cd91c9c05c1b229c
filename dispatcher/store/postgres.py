"""PostgreSQL backend: several hosts on one database (psycopg 3, async, pooled).

The statements are the SQLite backend's (`store.sql`), with PostgreSQL's
placeholders and its row locks where hosts race: a claim takes its row
`FOR UPDATE SKIP LOCKED`, so hosts claiming at once pass over each other's
rows and never take the same task; a claim under a global quota, a guarded
de-duplicating insert and the migrations each hold a transaction-scoped
advisory lock, so their check and their write are one step across hosts.
psycopg errors become `StoreError` here, at the edge.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from dispatcher.errors import StoreError
from dispatcher.models import Attempt, Job, State, Task
from dispatcher.pricing import AGING_STEP_S, Budget
from dispatcher.store.base import (
    EndedAndClaimed,
    InsertedAndClaimed,
    NextClaim,
    TaskWrite,
    TaskWriter,
)
from dispatcher.store.cacheindex import CacheIndex
from dispatcher.store.hosts import Fence, Quota
from dispatcher.store.migrations import migrations
from dispatcher.store.outbox import SqlOutbox, WebhookOutbox
from dispatcher.store.pgclaimview import ClaimView, Sent, with_reads
from dispatcher.store.pggates import GateMirror
from dispatcher.store.pglisten import host_option
from dispatcher.store.pglocks import (
    IF_SLOT_FREED,
    MIGRATION_LOCK,
    claim_lock,
    insert_locks,
    slot_freed,
    swaps_slot,
    xact_lock,
)
from dispatcher.store.pgplaces import (
    Places,
    ahead_args,
    ahead_sql,
    placed_insert,
    placed_insert_unless_twin,
)
from dispatcher.store.pgpool import HotFirstPool
from dispatcher.store.pgrunnow import insert_running, runs_at_once
from dispatcher.store.pgtrips import (
    CountingConnection,
    CountingCursor,
    RoundTrips,
    count_on,
    has_rows,
)
from dispatcher.store.postgres_beats import PostgresBeatOps
from dispatcher.store.postgres_cache import PostgresCacheIndex
from dispatcher.store.postgres_hosts import PostgresHostOps, display_url
from dispatcher.store.postgres_jobs import PostgresJobOps
from dispatcher.store.rows import (
    row_to_attempt,
    row_to_task,
    task_to_row,
)
from dispatcher.store.sql import (
    ID_TABLES,
    RECENT_DURATIONS,
    SELECT_TASK,
    STALE_RUNNING,
    TWIN,
    insert_sql,
    list_tasks_where,
    pg_marks,
)
from dispatcher.store.taskwrites import (
    Statement,
    postgres_write,
    task_claim_gated,
)

Row = dict[str, Any]

POOL_MAX = 10
CONNECT_TIMEOUT_S = 10.0


class PostgresStore(PostgresJobOps, PostgresHostOps, PostgresBeatOps, TaskWriter):
    claims_on_insert = True  # a submit's claim rides with its insert

    def __init__(self, url: str, host: str = "", *, pool_max: int = POOL_MAX) -> None:
        self.url = url
        self.host = host
        # Every exchange with the server, counted (issue 31 bounds them per task).
        self.round_trips = RoundTrips()
        # The connection used last first: a few hot backends (`store.pgpool`).
        self._pool: AsyncConnectionPool[psycopg.AsyncConnection[Row]] = HotFirstPool(
            url,
            connection_class=CountingConnection,
            configure=count_on(self.round_trips),
            min_size=1,
            max_size=pool_max,
            open=False,
            timeout=CONNECT_TIMEOUT_S,
            # `dispatcher.host` names this host in the notices its task writes
            # send (see store.pglisten), so that it does not hear itself.
            kwargs={
                "autocommit": True,
                "row_factory": dict_row,
                "cursor_factory": CountingCursor,
                **({"options": host_option(host)} if host else {}),
            },
        )
        self._opened = False
        self._places = Places()
        self.gates = GateMirror()
        # Claims known to find nothing (nothing pending, a quota full) from
        # the last claim, while the listener (which keeps `gates` live)
        # hears every change.
        self.claim_view = ClaimView(self.gates)
        self._cache_index = PostgresCacheIndex(url, host, self.round_trips)
        self._outbox = SqlOutbox(
            self._outbox_run, self._outbox_batch, lock="FOR UPDATE SKIP LOCKED"
        )

    @property
    def cache_index(self) -> CacheIndex:
        return self._cache_index

    @property
    def webhook_outbox(self) -> WebhookOutbox:
        return self._outbox

    async def _outbox_run(self, sql: str, args: Sequence[Any]) -> list[Any]:
        return await self._query(sql, args, what="webhook outbox access")

    async def _outbox_batch(self, sql: str, many: Sequence[Sequence[Any]]) -> None:
        async with (
            self._conn("webhook outbox write") as conn,
            conn.transaction(),
            conn.cursor() as cur,
        ):
            await cur.executemany(pg_marks(sql), many)

    # -- plumbing ------------------------------------------------------------
    @asynccontextmanager
    async def _conn(self, what: str) -> AsyncIterator[psycopg.AsyncConnection[Row]]:
        if not self._opened:
            await self._open()
        try:
            async with self._pool.connection() as conn:
                yield conn
        except psycopg.Error as exc:
            raise StoreError(f"PostgreSQL {what} failed: {exc}") from exc
        except PoolTimeout as exc:
            raise StoreError(f"PostgreSQL {what}: no connection: {exc}") from exc

    async def _open(self) -> None:
        # One plain connection first: an unreachable server or a refused
        # login is said at once and plainly (the pool would retry quietly
        # until its timeout).
        try:
            probe = await psycopg.AsyncConnection.connect(
                self.url, connect_timeout=int(CONNECT_TIMEOUT_S)
            )
        except psycopg.Error as exc:
            raise StoreError(
                f"cannot connect to PostgreSQL at {display_url(self.url)}: {exc}"
            ) from exc
        await probe.close()
        try:
            await self._pool.open(wait=True, timeout=CONNECT_TIMEOUT_S)
        except PoolTimeout as exc:
            raise StoreError(
                f"cannot connect to PostgreSQL at {display_url(self.url)}: {exc}"
            ) from exc
        self._opened = True

    async def _query(
        self, sql: str, args: Sequence[Any] = (), *, what: str = "read", marked: bool = False
    ) -> list[Row]:
        """Run one statement (`?` marks, or PostgreSQL's own when `marked`)."""
        async with self._conn(what) as conn:
            cur = await conn.execute(sql if marked else pg_marks(sql), args)
            return await cur.fetchall() if has_rows(cur) else []

    async def _pipelined(self, statements: Sequence[Statement], *, what: str) -> list[list[Row]]:
        """Statements sent together and answered together: one round trip
        (pipeline mode), each statement's rows, as one transaction. The
        server commits a pipeline at its Sync, sent once at its end; a failed
        statement skips the rest and rolls back the ones before it. No BEGIN
        or COMMIT of our own (each one more statement through psycopg, ~0.1 ms
        of our CPU). Each statement still takes its own snapshot, after the
        ones before it ran: a lock taken by one holds for the next."""
        async with self._conn(what) as conn:
            try:
                async with conn.pipeline():
                    # Prepared at their first run, not psycopg's fifth: these are
                    # the task writes, a few texts run for every task, and each
                    # run unprepared is planned anew (a claim's plan ~0.6 ms of
                    # the server's CPU), on each connection of the pool.
                    cursors = [await conn.execute(s.sql, s.args, prepare=True) for s in statements]
            except BaseException:
                # Cancelled mid-way, the pipeline may not have reached its
                # Sync: its transaction is ended here, not left to the pool.
                with contextlib.suppress(psycopg.Error):
                    await conn.rollback()
                raise
            return [await cur.fetchall() if has_rows(cur) else [] for cur in cursors]

    async def _write1(
        self, sql: str, args: Sequence[Any] = (), *, marked: bool = False
    ) -> list[Row]:
        return await self._query(sql, args, what="write", marked=marked)

    async def migrate(self) -> None:
        async with self._conn("migration") as conn, conn.transaction():
            # Several hosts may start at once: one migrates, the others wait
            # here and then find nothing left to do.
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
            await conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)"
            )
            cur = await conn.execute("SELECT MAX(version) AS v FROM schema_version")
            row = await cur.fetchone()
            current = (row or {}).get("v") or 0
            for migration in migrations("postgresql"):
                if migration.version <= current:
                    continue
                for statement in migration.statements:
                    await conn.execute(statement)
                await conn.execute(
                    "INSERT INTO schema_version (version) VALUES (%s)", (migration.version,)
                )

    async def schema_version(self) -> int:
        rows = await self._query("SELECT MAX(version) AS v FROM schema_version")
        return int(rows[0]["v"] or 0)

    async def close(self) -> None:
        if self._opened:
            await self._pool.close()
            self._opened = False
        self._cache_index.close()

    # -- tasks -------------------------------------------------------------
    async def insert_tasks(self, tasks: Sequence[Task], job: Job | None = None) -> list[Task]:
        if job is None and len(tasks) == 1:
            # The common case (one POST, one task): one statement, no
            # transaction, the task's place in its queue read with it.
            row = task_to_row(tasks[0])
            (one,) = await self._write1(
                placed_insert(f"INSERT INTO tasks ({', '.join(row)}) VALUES ({_marks(row)})"),
                tuple(row.values()),
            )
            return [self._placed(tasks[0], one["seq"], one)]
        stored = await self._insert_many(tasks, job)
        for task in stored:
            self.claim_view.saw(task)
        return stored

    async def _insert_many(self, tasks: Sequence[Task], job: Job | None) -> list[Task]:
        seqs = []
        async with self._conn("write") as conn, conn.transaction():
            if job is not None:
                await conn.execute(
                    "INSERT INTO jobs (id, name, created_at) VALUES (%s, %s, %s)",
                    (job.id, job.name, job.created_at),
                )
            for task in tasks:
                row = task_to_row(task)
                cur = await conn.execute(pg_marks(insert_sql(row, "?", "seq")), tuple(row.values()))
                stored = await cur.fetchone()
                assert stored is not None
                seqs.append(int(stored["seq"]))
        return [task.replace(seq=seq) for task, seq in zip(tasks, seqs, strict=True)]

    async def insert_unless_twin(self, task: Task, created_since: float) -> tuple[Task, bool]:
        # One round trip, one transaction (`_insert_statements`).
        _, (row,) = await self._pipelined(
            self._insert_statements(task, created_since), what="write"
        )
        if row["new_seq"] is None:
            return row_to_task(row), False
        return self._placed(task, row["new_seq"], row), True

    def _insert_statements(
        self, task: Task, created_since: float, *, also_lock: str | None = None
    ) -> list[Statement]:
        """Identical submits on two hosts serialise on their fingerprint: the
        insert runs after the lock, so it sees a twin committed before it. The
        lock (and `also_lock` after it, in the same statement), then the
        insert unless a twin exists, answering the new task's place in its
        queue or the twin."""
        row = task_to_row(task)
        insert = placed_insert_unless_twin(
            f"INSERT INTO tasks ({', '.join(row)}) SELECT {_marks(row)}", TWIN
        )
        return [
            insert_locks(task, also_lock),
            Statement(pg_marks(insert), (task.fingerprint, created_since, *row.values())),
        ]

    async def insert_and_claim(
        self, task: Task, created_since: float, claim: NextClaim
    ) -> InsertedAndClaimed | None:
        quota = claim.quota
        if not claim.queues or (
            quota is not None and self.claim_view.quota_full(quota.owner, quota.limit, claim.now)
        ):
            return None  # the claim would find nothing: the insert alone, as ever
        sent = self.claim_view.sending()
        if self.claim_view.nothing_pending(claim.now) and runs_at_once(task, claim):
            return await self._insert_running(task, created_since, claim, sent)
        claiming = self._claim_statement(claim)
        # One transaction, one round trip: the insert first, so the claim
        # sees the new task (and takes it when it is first in line). The
        # de-dup lock, then the quota's, in one statement before the insert
        # (each statement through psycopg costs ~0.1 ms of our CPU): every
        # transaction taking both takes them in this order.
        statements = self._insert_statements(task, created_since, also_lock=claim_lock(claim))
        answers = await self._pipelined([*statements, claiming], what="insert and claim")
        (row,) = answers[1]
        claimed = self._claimed(claim, answers[-1], sent)
        if row["new_seq"] is None:
            return InsertedAndClaimed(row_to_task(row), False, claimed)
        # A new task claimed at once was never pending for `claim_view`:
        # what the claim read (nothing else pending, say) holds.
        taken = claimed is not None and claimed.id == task.id
        placed = self._placed(task, row["new_seq"], row, seen=not taken)
        return InsertedAndClaimed(placed, True, claimed)

    async def _insert_running(
        self, task: Task, created_since: float, claim: NextClaim, sent: Sent
    ) -> InsertedAndClaimed:
        """`insert_and_claim` when its claim would take the new task: the
        task inserted running, if the server agrees (`store.pgrunnow`)."""
        lock = insert_locks(task, claim_lock(claim))
        inserting, running = insert_running(task, created_since, claim)
        _, (row,) = await self._pipelined([lock, inserting], what="insert running")
        if row["new_seq"] is None:
            return InsertedAndClaimed(row_to_task(row), False, None)
        if row["new_state"] != State.RUNNING.value:
            return InsertedAndClaimed(self._placed(task, row["new_seq"], row), True, None)
        # The new task is not among the running tasks the insert read.
        running_ids = [*(row["after_running"] or ()), task.id]
        self.claim_view.read(claim.quota, bool(row["after_any"]), running_ids, claim.now, sent)
        placed = self._placed(task, row["new_seq"], row, seen=False)
        return InsertedAndClaimed(placed, True, running.replace(seq=placed.seq))

    def _placed(self, task: Task, seq: int, row: Row, *, seen: bool = True) -> Task:
        """The inserted task with its `seq`; its place in the queue, read by
        the insert, kept for the submit's answer (`queue_place`). `seen`: told
        to `claim_view` (not when the same transaction claimed it)."""
        placed = task.replace(seq=int(seq))
        if seen:
            self.claim_view.saw(placed)
        if placed.state is State.PENDING:
            self._places.put(placed.queue, placed.seq, int(row["ahead"]), int(row["owners"]))
        return placed

    async def get_task(self, task_id: str) -> Task | None:
        rows = await self._query(f"{SELECT_TASK} WHERE id = ?", (task_id,))
        return row_to_task(rows[0]) if rows else None

    async def get_tasks(self, task_ids: Sequence[str]) -> list[Task]:
        if not task_ids:
            return []
        rows = await self._query(f"{SELECT_TASK} WHERE id = ANY(?) ORDER BY seq", (list(task_ids),))
        return [row_to_task(r) for r in rows]

    async def write_task(self, write: TaskWrite) -> Task | None:
        one = postgres_write(write)
        return self._written(await self._write1(one.sql, one.args, marked=True))

    async def finish_and_claim(self, write: TaskWrite, claim: NextClaim) -> EndedAndClaimed | None:
        quota = claim.quota
        if not claim.queues or self.claim_view.skip(
            quota.owner if quota else None,
            quota.limit if quota else 0,
            claim.now,
            ending=write.task_id,
        ):
            # The claim would find nothing (nothing pending; the quota full
            # even without this task): the end write alone, as ever.
            return None
        sent = self.claim_view.sending()
        # One transaction, one round trip: the end write first, so the claim
        # (its quota count included) sees the slot it freed; a failure of
        # either writes neither (the caller then ends the run on its own).
        if quota is not None and swaps_slot(write, claim):
            # The slot the write frees is the one the claim takes: no lock.
            ending = postgres_write(write, then=slot_freed(quota.owner))
            claiming = self._claim_statement(claim, only_if=IF_SLOT_FREED)
        else:
            # The claim's lock is taken by the write, the statement before it.
            lock, claiming = self._claim_statements(claim)
            ending = postgres_write(write, first=lock)
        rows, answer = await self._pipelined([ending, claiming], what="end and claim")
        done = self._written(rows)
        claimed = self._claimed(claim, answer, sent)
        return EndedAndClaimed(done, claimed)

    def _written(self, rows: list[Row]) -> Task | None:
        """The task a write returned (None: it was refused), kept in
        `claim_view` (it may have left or joined the pending tasks)."""
        if not rows:
            return None
        task = row_to_task(rows[0])
        self.claim_view.saw(task)
        return task

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
        if self.claim_view.skip(quota.owner if quota else None, quota.limit if quota else 0, now):
            return None  # nothing to claim, as the last claim read and nothing heard since
        sent = self.claim_view.sending()
        # Plain FIFO (the queue index's order) unless a pending task of the
        # queues has a priority or a deadline (a sort of the whole queue
        # then), also among fallbacks when some wait: the statement looks
        # (`ranked` and `fallbacks`, SQLite's hints, are not needed here).
        claim = NextClaim(
            tuple(queues), now, changes, fence, quota, budget, aging_step_s, tuple(prefer)
        )
        lock, claiming = self._claim_statements(claim)
        # Under a provider's quota or budget: the lock, then the claim, as
        # one transaction (`_claim_statements`).
        *_, answer = await self._pipelined(
            [claiming] if lock is None else [lock, claiming], what="claim"
        )
        return self._claimed(claim, answer, sent)

    def _claim_statements(self, claim: NextClaim) -> tuple[Statement | None, Statement]:
        """A claim as statements: under a provider's quota or budget the
        advisory lock to take in a statement before it (else None), and the
        claim with what it reads for `claim_view` (`with_reads`)."""
        lock = claim_lock(claim)
        return (xact_lock(lock) if lock else None), self._claim_statement(claim)

    def _claim_statement(self, claim: NextClaim, *, only_if: str = "") -> Statement:
        quota = claim.quota
        claiming = task_claim_gated(
            claim.queues,
            claim.now,
            claim.changes,
            fence=claim.fence,
            quota=quota,
            budget=claim.budget,
            prefer=claim.prefer,
            aging_step_s=claim.aging_step_s,
            only_if=only_if,
        )
        return with_reads(claiming, quota.owner if quota is not None else None)

    def _claimed(self, claim: NextClaim, answer: list[Row], sent: Sent) -> Task | None:
        """The claimed task from its statement's answer (`with_reads`), what
        the claim read besides kept in `claim_view`."""
        (row,) = answer
        self.claim_view.read(
            claim.quota, bool(row["after_any"]), row["after_running"], claim.now, sent
        )
        return row_to_task(row) if row["id"] is not None else None

    async def task_attempts(self, task_id: str) -> list[Attempt]:
        rows = await self._query("SELECT * FROM attempts WHERE task_id = ? ORDER BY id", (task_id,))
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
        rows = await self._query(
            f"{SELECT_TASK}{where} ORDER BY seq {order} LIMIT ?", (*args, limit)
        )
        return [row_to_task(r) for r in rows]

    async def ids_with_prefix(self, table: str, prefix: str, limit: int = 10) -> list[str]:
        if table not in ID_TABLES:
            raise ValueError(f"no ids in table {table!r}")
        # starts_with, not a range: text order follows the database's collation.
        rows = await self._query(
            f"SELECT id FROM {table} WHERE starts_with(id, ?) ORDER BY id LIMIT ?",
            (prefix, limit),
        )
        return [r["id"] for r in rows]

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
        return [row_to_task(r) for r in await self._query(sql, args)]

    async def stale_running(self, heartbeat_before: float) -> list[Task]:
        rows = await self._query(STALE_RUNNING, (heartbeat_before,))
        return [row_to_task(r) for r in rows]

    async def count_ahead(self, queue: str, seq: int) -> int:
        # From the database: tasks of every host share the queue.
        rows = await self._query(f"SELECT {ahead_sql('?', '?')} AS n", ahead_args(queue, seq))
        return int(rows[0]["n"])

    async def running_owners(self, queue: str) -> int:
        rows = await self._query(
            "SELECT COUNT(DISTINCT owner) AS n FROM tasks WHERE state = 'running' AND queue = ?",
            (queue,),
        )
        return int(rows[0]["n"])

    async def queue_place(self, queue: str, seq: int, *, owners: bool) -> tuple[int, int]:
        # Asked for a task just inserted here (the submit's answer): its
        # insert read the place already, no round trip of its own.
        kept = self._places.take(queue, seq)
        if kept is not None:
            return kept[0], kept[1] if owners else 0
        rows = await self._query(
            f"SELECT {ahead_sql('?', '?')} AS ahead, "
            + (
                "(SELECT COUNT(DISTINCT owner) FROM tasks WHERE state = 'running' AND queue = ?)"
                if owners
                else "0"
            )
            + " AS owners",
            (*ahead_args(queue, seq), queue) if owners else ahead_args(queue, seq),
        )
        return int(rows[0]["ahead"]), int(rows[0]["owners"])

    async def queued_counts(self) -> dict[str, int]:
        rows = await self._query(
            "SELECT queue, COUNT(*) AS n FROM tasks WHERE state = 'pending' GROUP BY queue"
        )
        return {r["queue"]: int(r["n"]) for r in rows}

    async def state_counts(self) -> dict[tuple[str, str], int]:
        rows = await self._query(
            "SELECT model, state, COUNT(*) AS n FROM tasks GROUP BY model, state"
        )
        return {(r["model"], r["state"]): int(r["n"]) for r in rows}

    async def recent_durations(self, model: str, limit: int = 20) -> list[float]:
        rows = await self._query(RECENT_DURATIONS, (model, limit))
        return [float(r["d"]) for r in rows]

    async def find_by_fingerprint(self, fingerprint: str, created_since: float) -> Task | None:
        rows = await self._query(TWIN, (fingerprint, created_since))
        return row_to_task(rows[0]) if rows else None


def _marks(row: Mapping[str, Any]) -> str:
    return ", ".join("?" for _ in row)
