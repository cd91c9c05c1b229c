"""Counting the round trips a PostgreSQL store makes, by what they ran.

Issue 31 bounds them (per task, at most its transitions plus one), so the
store counts every exchange with the server on its pool's connections.
`CountingConnection.wait` is the one point psycopg passes through for each
(a statement, a BEGIN or COMMIT); a wait that sends nothing (a COMMIT in
autocommit mode) is not one. In pipeline mode the statements go out without
waiting and the pipeline's sync waits for all their answers: that sync is
the round trip, named after what it carried. A statement a connection
prepares (psycopg does after five runs) adds one exchange the first time
only, inside the same wait: not counted apart.

The counters cost an increment per exchange; they are always on, and
`bench.service_child` dumps them (`PostgresStore.round_trips`).
"""

from __future__ import annotations

import functools
import re
import threading
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

import psycopg
from psycopg.abc import PQGen, Query, QueryNoTemplate
from psycopg.pq import ExecStatus

Row = dict[str, Any]
RV = TypeVar("RV")

_LABEL_WORDS = 4
_LABEL_CHARS = 160
_SPACE = re.compile(r"\s+")
# psycopg's generators other than a cursor's statement, by what they send.
_GENERATORS = {
    "BaseTransaction._enter_gen": "BEGIN",
    "BaseTransaction._exit_gen": "COMMIT",
    "BaseConnection._commit_gen": "COMMIT",
    "BaseConnection._rollback_gen": "ROLLBACK",
}
# A pipeline's generators that wait for the server's answers.
_SYNCS = frozenset({"BasePipeline._exit_gen", "BasePipeline._sync_gen", "BasePipeline._fetch_gen"})


def _on_io(gen: PQGen[RV], count: Callable[[], None]) -> PQGen[RV]:
    """`gen`, calling `count` once it first waits on the socket: a generator
    that finishes without waiting (nothing to send) made no exchange."""
    try:
        state = next(gen)
    except StopIteration as done:
        return cast(RV, done.value)
    count()
    while True:
        ready = yield state
        try:
            state = gen.send(ready)
        except StopIteration as done:
            return cast(RV, done.value)


def statement_label(query: Query) -> str:
    """What a statement does, in its first words ("UPDATE tasks SET state")."""
    text = query if isinstance(query, str) else str(query)
    # Its start only: a statement is thousands of characters, and this runs
    # for every one (a regex over the whole text was ~0.4 ms of CPU a task).
    return _label(text[:_LABEL_CHARS])


# How a claim's statement starts (its label, `statement_label`): alone or
# after an end or an insert in a pipeline ("WITH c AS (UPDATE"), or an
# insert of a task running at once (`store.pgrunnow`).
CLAIM_STARTS = ("WITH c AS (UPDATE", "WITH claim_now AS")


def is_claim(label: str) -> bool:
    """Whether a round trip's label (`RoundTrips.by_statement`) has a claim in it."""
    return any(start in label for start in CLAIM_STARTS)


@functools.lru_cache(maxsize=1024)
def _label(start: str) -> str:
    return " ".join(_SPACE.sub(" ", start).strip().split(" ")[:_LABEL_WORDS])


def has_rows(cursor: psycopg.AsyncCursor[Any] | psycopg.Cursor[Any]) -> bool:
    """Whether the cursor's statement returned rows (fetchall may be called).

    `cursor.description`, which says the same, builds a `Column` per column
    each time it is read, type lookups included: ~2 ms of CPU a task on
    PostgreSQL's task rows (40 columns, three statements a task).
    """
    res = cursor.pgresult
    return res is not None and (
        res.nfields > 0 or res.status in (ExecStatus.TUPLES_OK, ExecStatus.SINGLE_TUPLE)
    )


class RoundTrips:
    """Exchanges with the server, in all and by statement (`statement_label`)."""

    def __init__(self) -> None:
        self.total = 0
        self.by_statement: Counter[str] = Counter()
        # The cache index counts from worker threads.
        self._lock = threading.Lock()

    def add(self, label: str) -> None:
        with self._lock:
            self.total += 1
            self.by_statement[label] += 1

    def as_dict(self) -> dict[str, Any]:
        return {"total": self.total, "by_statement": dict(self.by_statement.most_common())}


class CountingCursor(psycopg.AsyncCursor[Row]):
    """Names the statement for the connection's next exchange."""

    async def execute(
        self,
        query: Query,
        params: Any = None,
        *,
        prepare: bool | None = None,
        binary: bool | None = None,
    ) -> CountingCursor:
        conn = self.connection
        if isinstance(conn, CountingConnection):
            conn.label = statement_label(query)
        # Our statements are plain text with parameters (never a Template).
        await super().execute(cast(QueryNoTemplate, query), params, prepare=prepare, binary=binary)
        return self


class CountingConnection(psycopg.AsyncConnection[Row]):
    """A pool's connection that adds each exchange to its store's `RoundTrips`
    (set by the pool's `configure`, `count_on`)."""

    trips: RoundTrips | None = None
    label: str = ""
    # What the open pipeline carries, until its sync (the round trip).
    carried: list[str] | None = None

    async def wait(
        self,
        gen: PQGen[RV],
        interval: float = 0.1,
        timeout: float | None = None,  # noqa: ASYNC109 (psycopg's own signature)
    ) -> RV:
        trips = self.trips
        if trips is not None:
            gen = self._counted(gen, trips)
        return await super().wait(gen, interval, timeout)

    def _counted(self, gen: PQGen[RV], trips: RoundTrips) -> PQGen[RV]:
        name = getattr(gen, "__qualname__", "")
        label = self.label if name.endswith("._execute_gen") else _GENERATORS.get(name, name)
        self.label = ""
        if self._pipeline is None:
            return _on_io(gen, lambda: trips.add(label))
        if name in _SYNCS:
            carried, self.carried = self.carried or [], None
            return _on_io(gen, lambda: trips.add("pipeline: " + "; ".join(carried)))
        if self.carried is None:
            self.carried = []
        if not name.startswith("BasePipeline."):
            self.carried.append(label)
        return gen


def count_on(trips: RoundTrips) -> Callable[[psycopg.AsyncConnection[Row]], Awaitable[None]]:
    """The pool's `configure`: each new connection counts into `trips`."""

    async def configure(conn: psycopg.AsyncConnection[Row]) -> None:
        if isinstance(conn, CountingConnection):
            conn.trips = trips

    return configure


__all__ = [
    "CountingConnection",
    "CountingCursor",
    "RoundTrips",
    "count_on",
    "has_rows",
    "statement_label",
]
