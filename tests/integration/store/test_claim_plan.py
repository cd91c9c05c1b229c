"""A claim reads the task it takes, not the backlog (PostgreSQL, migration 0011).

psycopg prepares a statement it runs often, and the server then keeps one
plan for it, made from the table's statistics at the time: on a new
database, none. With `tasks_running` on (state, owner), that plan found the
pending tasks through it, every one of them read and sorted at each claim,
and the claimed row among them rather than by its key: a backlog of a
thousand tasks made every claim read a thousand rows. The plan is made here
as a new database's first claims make it (on the empty table, generic),
then run against a backlog, on a real server.
"""

from __future__ import annotations

import re
import time

import psycopg

from dispatcher.models import State
from dispatcher.store import NextClaim
from dispatcher.store.hosts import Quota
from dispatcher.store.postgres import PostgresStore
from tests.support.pgplans import rows_read
from tests.support.tasks import api_task

BACKLOG = 300
ENDED = 100
RUNNING = 4
# The claimed row, the provider's running tasks (counted twice: the quota's
# guard and what the claim reads for the view), a pending one after it: 13
# here. Before migration 0011, 408.
ROWS_READ_MAX = 3 * RUNNING + 10


def numbered(sql: str) -> str:
    """psycopg's `%s` marks as PREPARE's `$1`, `$2`, ..."""
    count = iter(range(1, 10_000))
    return re.sub(r"%s", lambda _: f"${next(count)}", sql).replace("%%", "%")


async def test_a_claim_under_a_quota_reads_rows_by_the_task_not_by_the_backlog(
    pg_store_at: tuple[PostgresStore, str],
) -> None:
    store, url = pg_store_at
    claim = NextClaim(
        queues=("g",),
        now=time.time(),
        changes={"owner": "demo", "host": "h1"},
        quota=Quota("demo", 50),
    )
    statement = store._claim_statement(claim)
    with psycopg.connect(url, autocommit=True) as conn:
        # The one plan a prepared statement keeps, made while the table is
        # empty, as on a new database.
        conn.execute("SET plan_cache_mode = force_generic_plan")
        conn.execute(f"PREPARE claim AS {numbered(statement.sql)}")
        conn.execute("BEGIN")
        conn.execute(
            psycopg.sql.SQL("EXPLAIN EXECUTE claim({})").format(
                psycopg.sql.SQL(", ").join(psycopg.sql.Literal(a) for a in statement.args)
            )
        )
        conn.execute("ROLLBACK")

        await store.insert_tasks([api_task(f"t{n:04d}") for n in range(BACKLOG)])
        for n in range(ENDED + RUNNING):
            task = await store.claim_next(["g"], time.time(), {"owner": "demo", "host": "h1"})
            assert task is not None
            if n < ENDED:
                await store.update_task(
                    task.id,
                    expect_state=State.RUNNING,
                    changes={"state": State.SUCCESS, "finished_at": time.time()},
                )

        conn.execute("BEGIN")
        try:
            explained = conn.execute(
                psycopg.sql.SQL("EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE claim({})").format(
                    psycopg.sql.SQL(", ").join(psycopg.sql.Literal(a) for a in statement.args)
                )
            ).fetchone()
        finally:
            conn.execute("ROLLBACK")
    assert explained is not None
    (plan,) = explained[0]
    pending = BACKLOG - ENDED - RUNNING
    read = rows_read(plan["Plan"])
    # The claim took one.
    assert plan["Plan"]["Actual Rows"] == 1
    assert read <= ROWS_READ_MAX, f"a claim read {read} rows with {pending} tasks pending"
