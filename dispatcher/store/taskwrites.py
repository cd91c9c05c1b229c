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

from dispatcher.models import Attempt, State
from dispatcher.store.hosts import Fence, Quota
from dispatcher.store.rows import attempt_to_row, encode_changes
from dispatcher.store.sql import claim_sql, pg_marks, update_sql


@dataclass(frozen=True)
class Dialect:
    name: str
    # A statement written with `?` marks, in this dialect's placeholders.
    marks: Callable[[str], str]
    # How a claim's inner SELECT locks the row it picks.
    claim_lock: str


SQLITE = Dialect("sqlite", lambda sql: sql, "")
# Hosts claiming at once pass over each other's rows, never take the same one.
POSTGRESQL = Dialect("postgresql", pg_marks, "FOR UPDATE SKIP LOCKED")


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


def task_update(
    dialect: Dialect,
    task_id: str,
    *,
    expect_state: State,
    expect_attempt: int | None,
    changes: Mapping[str, Any],
    unless_cancel_requested: bool,
    ended: Attempt | None,
    fence: Fence | None,
) -> TaskUpdate:
    columns = encode_changes(changes)
    sql = update_sql(
        columns,
        attempt=expect_attempt is not None,
        unless_cancel=unless_cancel_requested,
        fenced=fence is not None,
    )
    args: list[Any] = [*columns.values(), task_id, expect_state.value]
    if expect_attempt is not None:
        args.append(expect_attempt)
    if fence is not None:
        args += [fence.account, fence.token]
    history = None
    if ended is not None:
        row = attempt_to_row(ended)
        history = Statement(
            dialect.marks(
                f"INSERT INTO attempts ({', '.join(row)}) VALUES ({', '.join('?' for _ in row)})"
            ),
            tuple(row.values()),
        )
    return TaskUpdate(Statement(dialect.marks(sql), tuple(args)), history)


def task_claim(
    dialect: Dialect,
    queues: Sequence[str],
    now: float,
    changes: Mapping[str, Any],
    *,
    fence: Fence | None,
    quota: Quota | None,
) -> Statement:
    """The claim of the oldest ready pending task of `queues` (not empty)."""
    columns = encode_changes({**changes, "state": State.RUNNING})
    sql = claim_sql(
        len(queues),
        columns,
        fenced=fence is not None,
        quota=quota is not None,
        lock=dialect.claim_lock,
    )
    args: list[Any] = [*columns.values(), *queues, now]
    if fence is not None:
        args += [fence.account, fence.token]
    if quota is not None:
        args += [quota.owner, quota.limit]
    return Statement(dialect.marks(sql), tuple(args))
