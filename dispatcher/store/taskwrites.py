"""The two task writes every backend makes, built once: statements and their
arguments, in the dialect's placeholders. A backend only runs them.

`update_task` is a compare-and-set on the task's state (and attempt, cancel
flag, account lease) plus, when it ends an attempt, that attempt's history
row in the same transaction. `claim_next` finds and takes the oldest ready
task of some queues in one statement. What differs between SQLite and
PostgreSQL is the placeholder and the claim's row lock (`Dialect`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dispatcher.models import State
from dispatcher.pricing import AGING_STEP_S, Budget
from dispatcher.store.base import TaskWrite
from dispatcher.store.hosts import Fence, Quota
from dispatcher.store.rows import attempt_to_row, encode_changes
from dispatcher.store.sql import (
    AGING_POSTGRES,
    AGING_SQLITE,
    FALLBACKS_WAITING,
    claim_sql,
    claim_sql_gated,
    deferred_args,
    like_pattern,
    pg_marks,
    ranked_sql,
    update_sql,
)


@dataclass(frozen=True)
class Dialect:
    name: str
    # A statement written with `?` marks, in this dialect's placeholders.
    marks: Callable[[str], str]
    # How a claim's inner SELECT locks the row it picks.
    claim_lock: str
    # Whole aging steps a task waited, in this dialect's SQL (the claim's order).
    aging: str
    # How a query names the partial index it must use: SQLite, without
    # statistics, would scan the whole queue; PostgreSQL's planner picks it.
    use_index: Callable[[str], str]
    # The position of a substring, 0 when absent (the fallbacks' order).
    position: str = "instr"


SQLITE = Dialect("sqlite", lambda sql: sql, "", AGING_SQLITE, lambda index: f"INDEXED BY {index}")
# Hosts claiming at once pass over each other's rows, never take the same one.
POSTGRESQL = Dialect(
    "postgresql", pg_marks, "FOR UPDATE SKIP LOCKED", AGING_POSTGRES, lambda index: "", "strpos"
)


@dataclass(frozen=True)
class Statement:
    sql: str
    args: tuple[Any, ...]


@dataclass(frozen=True)
class TaskUpdate:
    """The compare-and-set (it returns the updated row, or none when the task
    was not as expected) and, only if it matched, the history row to insert
    in the same transaction."""

    update: Statement
    history: Statement | None
    # The history row's columns, in the order of `history.args`.
    history_columns: tuple[str, ...] = ()


def task_update(dialect: Dialect, write: TaskWrite) -> TaskUpdate:
    """`write` as SQL: the one place a `TaskWrite` becomes statements."""
    columns = encode_changes(write.changes)
    sql = update_sql(
        columns,
        attempt=write.expect_attempt is not None,
        unless_cancel=write.unless_cancel_requested,
        fenced=write.fence is not None,
    )
    args: list[Any] = [*columns.values(), write.task_id, write.expect_state.value]
    if write.expect_attempt is not None:
        args.append(write.expect_attempt)
    if write.fence is not None:
        args += [write.fence.account, write.fence.token]
    if write.ended is None:
        return TaskUpdate(Statement(dialect.marks(sql), tuple(args)), None)
    row = attempt_to_row(write.ended)
    history = Statement(
        dialect.marks(
            f"INSERT INTO attempts ({', '.join(row)}) VALUES ({', '.join('?' for _ in row)})"
        ),
        tuple(row.values()),
    )
    return TaskUpdate(Statement(dialect.marks(sql), tuple(args)), history, tuple(row))


def update_with_history(
    write: TaskUpdate, *, first: Statement | None = None, then: Statement | None = None
) -> Statement:
    """PostgreSQL: the compare-and-set and its history row as one statement
    (the history row is inserted once per row the update returns: none when
    it did not match), so the write is atomic without BEGIN and COMMIT round
    trips. SQLite has no writes inside WITH; it runs the two in a transaction.

    `first`: a SELECT run too, whether the update matches or not (a lock
    for the statement after this one: the statement's gate, evaluated once
    before any row is read), its rows not answered. `then`: a SELECT from
    `u` (the row as updated) run too, its rows not answered either (a mark
    for the statement after this one, `pglocks.slot_freed`)."""
    if write.history is None and first is None and then is None:
        return write.update
    parts: list[str] = []
    args: list[Any] = []
    if first is not None:
        parts.append(f"g AS MATERIALIZED ({first.sql})")
        args += first.args
    parts.append(f"u AS ({write.update.sql})")
    args += write.update.args
    if write.history is not None:
        columns = ", ".join(write.history_columns)
        marks = ", ".join(POSTGRESQL.marks("?") for _ in write.history_columns)
        parts.append(f"h AS (INSERT INTO attempts ({columns}) SELECT {marks} FROM u)")
        args += write.history.args
    gates = ["EXISTS (SELECT 1 FROM g)"] if first is not None else []
    if then is not None:
        parts.append(f"m AS MATERIALIZED ({then.sql})")
        args += then.args
        # A condition true of any count: `m` runs once, before `u`'s rows are answered.
        gates.append("(SELECT COUNT(*) FROM m) >= 0")
    gate = f" WHERE {' AND '.join(gates)}" if gates else ""
    return Statement(f"WITH {', '.join(parts)} SELECT * FROM u{gate}", tuple(args))


def postgres_write(
    write: TaskWrite, *, first: Statement | None = None, then: Statement | None = None
) -> Statement:
    """A task write on PostgreSQL as one statement (the history row, if any,
    in its WITH): atomic on its own, without BEGIN/COMMIT round trips, alone
    or first in `finish_and_claim`'s pipeline (`first`: the claim's lock,
    taken by it; `then`: the mark of a freed slot, `pglocks.slot_freed`)."""
    return update_with_history(task_update(POSTGRESQL, write), first=first, then=then)


def ranked_query(dialect: Dialect, queues: Sequence[str]) -> Statement:
    """Whether a pending task of `queues` has a priority or a deadline (then the
    claim sorts the queue; else it is served FIFO from the queue index)."""
    sql = ranked_sql(len(queues), hint=dialect.use_index("tasks_ranked"))
    return Statement(dialect.marks(sql), tuple(queues))


def fallbacks_query(dialect: Dialect) -> Statement:
    """Whether any pending task waits with fallback queues."""
    sql = FALLBACKS_WAITING.format(hint=dialect.use_index("tasks_fallback"))
    return Statement(dialect.marks(sql), ())


def task_claim(
    dialect: Dialect,
    queues: Sequence[str],
    now: float,
    changes: Mapping[str, Any],
    *,
    fence: Fence | None,
    quota: Quota | None,
    budget: Budget | None = None,
    ranked: bool = False,
    fallbacks: bool = False,
    prefer: Sequence[str] = (),
    aging_step_s: float = AGING_STEP_S,
) -> Statement:
    """The claim of the first ready pending task of `queues` (not empty), in
    queue order (`ranked`: priority aged, deadline, FIFO; else FIFO), also
    among tasks waiting there as a fallback when `fallbacks`, except those
    left to a free lane of an earlier choice (`prefer`: its queues)."""
    columns = encode_changes({**changes, "state": State.RUNNING})
    sql = claim_sql(
        len(queues),
        columns,
        fenced=fence is not None,
        quota=quota is not None,
        lock=dialect.claim_lock,
        budget=budget is not None,
        aging=dialect.aging,
        ranked=ranked,
        fallbacks=fallbacks,
        prefer=len(prefer) if fallbacks else 0,
        position=dialect.position,
    )
    alts = [like_pattern(f"|{queue}|") for queue in queues] if fallbacks else []
    if fallbacks and prefer:
        alts += deferred_args(queues, prefer)
    args: list[Any] = [*columns.values(), *queues, *alts, now, *guard_args(fence, quota, budget)]
    if ranked:
        args += [now, aging_step_s]
    return Statement(dialect.marks(sql), tuple(args))


def guard_args(fence: Fence | None, quota: Quota | None, budget: Budget | None) -> list[Any]:
    """The arguments of a claim's guard (`sql.claim_guard`), in its order."""
    args: list[Any] = []
    if fence is not None:
        args += [fence.account, fence.token]
    if quota is not None:
        args += [quota.owner, quota.limit]
    if budget is not None:
        args += [budget.provider, budget.since, budget.limit_usd]
    return args


def task_claim_gated(
    queues: Sequence[str],
    now: float,
    changes: Mapping[str, Any],
    *,
    fence: Fence | None,
    quota: Quota | None,
    budget: Budget | None = None,
    prefer: Sequence[str] = (),
    aging_step_s: float = AGING_STEP_S,
    only_if: str = "",
) -> Statement:
    """PostgreSQL's claim: `task_claim` with its looks at the queues (ranked?
    fallbacks waiting?) made inside the statement: one round trip. `only_if`:
    a condition without marks, the claim made only when it holds."""
    columns = encode_changes({**changes, "state": State.RUNNING})
    sql = claim_sql_gated(
        len(queues),
        columns,
        fenced=fence is not None,
        quota=quota is not None,
        lock=POSTGRESQL.claim_lock,
        budget=budget is not None,
        aging=POSTGRESQL.aging,
        prefer=len(prefer),
        position=POSTGRESQL.position,
        only_if=only_if,
    )
    guard = guard_args(fence, quota, budget)
    alts = [like_pattern(f"|{queue}|") for queue in queues]
    alts += deferred_args(queues, prefer) if prefer else []
    ranked = [*queues, *queues, *alts, now, *guard, now, aging_step_s]
    fallbacks = [*queues, *queues, *alts, now, *guard]
    fifo = [*queues, *queues, now, *guard]
    return Statement(POSTGRESQL.marks(sql), (*columns.values(), *ranked, *fallbacks, *fifo))
