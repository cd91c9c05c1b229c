"""A new task's place in its queue, read by its insert (PostgreSQL).

The answer to a submit tells the task's place (`ahead`) and how many
owners serve its queue on all hosts. Read apart, that was a round trip per
submit of its own (issue 31); the insert reads it instead, in the same
statement (`placed_insert`), and the store keeps it until the submit's
answer asks (`Places`), once: a later look at the task reads afresh.
"""

from __future__ import annotations

from collections import OrderedDict

# Places kept for answers not asked yet (a task inserted and then found
# done from the cache, say): the oldest go first.
KEPT = 256

PLACE_COLUMNS = (
    "(SELECT COUNT(*) FROM tasks AS t WHERE t.state = 'pending' "
    "AND t.queue = i.queue AND t.seq < i.seq) AS ahead, "
    "(SELECT COUNT(DISTINCT t.owner) FROM tasks AS t WHERE t.state = 'running' "
    "AND t.queue = i.queue) AS owners"
)


def placed_insert(insert: str) -> str:
    """`insert` (an INSERT INTO tasks without RETURNING), answering the new
    row's `seq`, `ahead` and `owners`. The counts see the tasks committed
    before the statement began, never the new row: its place, as
    `Store.queue_place` reads it right after."""
    return f"WITH i AS ({insert} RETURNING seq, queue) SELECT i.seq, {PLACE_COLUMNS} FROM i"


def placed_insert_unless_twin(insert: str, twin: str) -> str:
    """`placed_insert` run only if `twin` (a SELECT of a task's columns, its
    marks first in the statement's) finds no row: one row answered always,
    the twin's columns (NULL when none) and the new row's `new_seq`, `ahead`
    and `owners` (NULL when not inserted). One statement where a lookup
    after the insert was another (~0.1 ms of our CPU each, through psycopg)."""
    return (
        f"WITH twin AS ({twin}), "
        f"i AS ({insert} WHERE NOT EXISTS (SELECT 1 FROM twin) RETURNING seq, queue) "
        f"SELECT twin.*, i.seq AS new_seq, {PLACE_COLUMNS} "
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
