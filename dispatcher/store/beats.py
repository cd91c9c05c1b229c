"""Heartbeats of a host's running tasks, written together (issue 31).

Each running task says it is alive every `heartbeat_s` (15 s): its
`heartbeat_at`, and its stage. One at a time, that is a statement (a round
trip on PostgreSQL) per running task per beat; the scheduler lines its tasks'
beats up on one grid (`scheduling.beats`), and the beats due at once go to
the store as one `Heartbeat` list: PostgreSQL writes them in one statement,
SQLite (in-process, no round trip to save) one after the other.

A beat is the compare-and-set `update_task` makes of it: only while the
task still runs the same attempt, and, for a task claimed under an account
lease, only while that lease has the token it ran under (a beat of an
earlier holder is refused). The written rows come back, so that a cancel
asked for meanwhile (`cancel_requested`) is seen from the beat's answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dispatcher.models import Stage
from dispatcher.store.hosts import Fence
from dispatcher.store.sql import COLUMNS
from dispatcher.store.taskwrites import Statement


@dataclass(frozen=True)
class Heartbeat:
    """One running attempt's sign of life: `at`, and the stage it is in."""

    task_id: str
    attempt: int
    at: float
    stage: Stage | None
    fence: Fence | None = None


def _qualified(columns: str, table: str) -> str:
    return ", ".join(f"{table}.{c.strip()}" for c in columns.split(","))


def heartbeats_statement(beats: Sequence[Heartbeat]) -> Statement:
    """PostgreSQL: every beat in one UPDATE, each row under its own guards
    (same attempt, still running, its lease's token when fenced); the rows
    it wrote come back."""
    if not beats:
        raise ValueError("no heartbeats to write")
    values: list[str] = []
    args: list[Any] = []
    for beat in beats:
        values.append("(%s, %s, %s, %s, %s, %s)")
        args += [
            beat.task_id,
            beat.attempt,
            beat.at,
            beat.stage.value if beat.stage is not None else None,
            beat.fence.account if beat.fence is not None else None,
            beat.fence.token if beat.fence is not None else None,
        ]
    # The first row's casts type the VALUES list's columns (a NULL alone
    # would be text).
    values[0] = "(%s::text, %s::integer, %s::double precision, %s::text, %s::text, %s::bigint)"
    sql = (
        "UPDATE tasks AS t SET heartbeat_at = b.at, stage = b.stage "
        f"FROM (VALUES {', '.join(values)}) AS b(id, attempt, at, stage, account, token) "
        "WHERE t.id = b.id AND t.state = 'running' AND t.attempt = b.attempt "
        "AND (b.account IS NULL OR EXISTS (SELECT 1 FROM leases AS l "
        "WHERE l.account = b.account AND l.token = b.token AND l.host IS NOT NULL)) "
        f"RETURNING {_qualified(COLUMNS, 't')}"
    )
    return Statement(sql, tuple(args))


__all__ = ["Heartbeat", "heartbeats_statement"]
