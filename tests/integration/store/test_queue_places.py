"""A pending task's place (`ahead`) on PostgreSQL: exact near the head, bounded work
behind a long backlog.

Counted row by row, a place behind 50,000 tasks cost each submit and each
look at the task 50,000 rows of the server's reading. The count stops at
`AHEAD_COUNTED` and estimates the rest from the backlog's density
(`store.pgplaces`), on a real server.
"""

from __future__ import annotations

import time

import psycopg

from dispatcher.store.pgplaces import AHEAD_COUNTED, ahead_args, ahead_sql
from dispatcher.store.postgres import PostgresStore
from tests.support.pgplans import rows_read
from tests.support.tasks import api_task

# Two of every three tasks in queue "g", the third in "h": the places of "g"
# are not its seqs.
TASKS = 3 * AHEAD_COUNTED
IN_G = [n for n in range(TASKS) if n % 3 != 2]


async def test_places_are_exact_up_to_the_count_then_close_estimates(
    pg_store_at: tuple[PostgresStore, str],
) -> None:
    store, url = pg_store_at
    tasks = await store.insert_tasks(
        [api_task(f"t{n:05d}", queue="g" if n % 3 != 2 else "h") for n in range(TASKS)]
    )
    g_seqs = [tasks[n].seq for n in IN_G]
    assert len(g_seqs) > AHEAD_COUNTED * 1.5

    # Near the head, every task counted.
    for place in (0, 1, AHEAD_COUNTED // 2, AHEAD_COUNTED):
        ahead, _ = await store.queue_place("g", g_seqs[place], owners=False)
        assert ahead == place
        assert await store.count_ahead("g", g_seqs[place]) == place

    # Past the count, an estimate within 2 % of the place.
    for place in (AHEAD_COUNTED + 1, AHEAD_COUNTED + 7, len(g_seqs) - 1):
        ahead, _ = await store.queue_place("g", g_seqs[place], owners=True)
        assert abs(ahead - place) <= max(2, place // 50), (place, ahead)

    # A submit's answer reads its place the same way, in its insert.
    fresh, inserted = await store.insert_unless_twin(api_task("late", queue="g"), time.time())
    assert inserted
    ahead, _ = await store.queue_place("g", fresh.seq, owners=False)
    assert abs(ahead - len(g_seqs)) <= len(g_seqs) // 50

    # The work stays bounded: the count reads AHEAD_COUNTED + 1 rows at most.
    with psycopg.connect(url, autocommit=True) as conn:
        explained = conn.execute(
            f"EXPLAIN (ANALYZE, FORMAT JSON) SELECT {ahead_sql('%s', '%s')}",
            ahead_args("g", fresh.seq),
        ).fetchone()
    assert explained is not None
    (plan,) = explained[0]
    assert rows_read(plan["Plan"]) <= AHEAD_COUNTED + 2


async def test_a_removed_task_leaves_the_places_behind_it(
    pg_store_at: tuple[PostgresStore, str],
) -> None:
    store, _ = pg_store_at
    tasks = await store.insert_tasks([api_task(f"t{n}") for n in range(5)])
    claimed = await store.claim_next(["g"], time.time(), {"owner": "demo", "host": "h1"})
    assert claimed is not None and claimed.id == "t0"
    assert await store.count_ahead("g", tasks[4].seq) == 3
