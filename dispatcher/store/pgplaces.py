"""A new task's place in its queue, read by its insert (PostgreSQL).

The answer to a submit tells the task's place (`ahead`) and how many
owners serve its queue on all hosts. Read apart, that was a round trip per
submit of its own (issue 31); the insert reads it instead, in the same
statement (`placed_insert`), and the store keeps it until the submit's
answer asks (`Places`), once: a later look at the task reads afresh.

A place is counted in the queue's index, task by task: a backlog of 50,000
made each submit (and each look at a pending task) read 50,000 rows, ~25 ms
of the server's CPU, O(n^2) for a batch submitted one by one. The count
stops at `AHEAD_COUNTED`; a place past it is estimated from the span of
seqs those tasks cover (the backlog's density, carried on to the task).
SQLite counts exactly, in memory (`store.sqlite_index`).
"""

from __future__ import annotations

from collections import OrderedDict

# Places kept for answers not asked yet (a task inserted and then found
# done from the cache, say): the oldest go first.
KEPT = 256

# Tasks ahead counted one by one (~0.5 us each on the server); a place
# further back is estimated. With three hosts draining a backlog, a count to
# 500 was ~250 us of the server's ~650 us a submit (`bench hosts`); a place
# past a hundred tells a user "wait" as well as an exact one does.
AHEAD_COUNTED = 100


def ahead_sql(queue: str, seq: str) -> str:
    """The pending tasks of `queue` before `seq` (SQL expressions; as marks,
    their values in the order `ahead_args` gives): exact up to
    `AHEAD_COUNTED`; past it, the first `AHEAD_COUNTED` + 1 read, and their
    density carried over the rest of the span."""
    read = AHEAD_COUNTED + 1
    return (
        f"(SELECT CASE WHEN COUNT(*) < {read} THEN COUNT(*) "
        f"ELSE {read} + CAST(({seq} - MAX(a.seq) - 1) * {read}.0 "
        "/ (MAX(a.seq) - MIN(a.seq) + 1) AS BIGINT) END "
        f"FROM (SELECT t.seq FROM tasks AS t WHERE t.state = 'pending' AND t.queue = {queue} "
        f"AND t.seq < {seq} ORDER BY t.seq LIMIT {read}) AS a)"
    )


def ahead_args(queue: str, seq: int) -> tuple[str | int, ...]:
    """The values of `ahead_sql`'s marks, in their order in the statement."""
    return (seq, queue, seq)


PLACE_COLUMNS = (
    f"{ahead_sql('i.queue', 'i.seq')} AS ahead, "
    "(SELECT COUNT(DISTINCT t.owner) FROM tasks AS t WHERE t.state = 'running' "
    "AND t.queue = i.queue) AS owners"
)


def placed_insert(insert: str) -> str:
    """`insert` (an INSERT INTO tasks without RETURNING), answering the new
    row's `seq`, `ahead` and `owners`. The counts see the tasks committed
    before the statement began, never the new row: its place, as
    `Store.queue_place` reads it right after."""
    return f"WITH i AS ({insert} RETURNING seq, queue) SELECT i.seq, {PLACE_COLUMNS} FROM i"


def placed_insert_unless_twin(insert: str, twin: str, *, first: str = "", also: str = "") -> str:
    """`placed_insert` run only if `twin` (a SELECT of a task's columns, its
    marks first in the statement's) finds no row: one row answered always,
    the twin's columns (NULL when none) and the new row's `new_seq`,
    `new_state`, `ahead` and `owners` (NULL when not inserted). One statement
    where a lookup after the insert was another (~0.1 ms of our CPU each,
    through psycopg). `first`: a WITH query before the twin's ("name AS
    (...)", its marks then first), which `insert` may read; `also`: more
    answer columns (", ... AS name")."""
    given = f"{first}, " if first else ""
    return (
        f"WITH {given}twin AS ({twin}), "
        f"i AS ({insert} WHERE NOT EXISTS (SELECT 1 FROM twin) RETURNING seq, queue, state) "
        f"SELECT twin.*, i.seq AS new_seq, i.state AS new_state, {PLACE_COLUMNS}{also} "
        "FROM (SELECT 1) AS one LEFT JOIN i ON true LEFT JOIN twin ON true"
    )


class Places:
    """Places read by inserts, each taken once by the submit's answer."""

    def __init__(self, kept: int = KEPT) -> None:
        self._kept = kept
        self._places: OrderedDict[tuple[str, int], tuple[int, int]] = OrderedDict()

    def put(self, queue: str, seq: int, ahead: int, owners: int) -> None:
        self._places[(queue, seq)] = (ahead, owners)
        while len(self._places) > self._kept:
            self._places.popitem(last=False)

    def take(self, queue: str, seq: int) -> tuple[int, int] | None:
        return self._places.pop((queue, seq), None)
