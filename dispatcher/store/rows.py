"""Task and account records to and from flat rows; shared by every backend."""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from dispatcher.models import (
    Account,
    Attempt,
    CacheEntry,
    Kind,
    Skipped,
    Stage,
    State,
    Task,
    TaskError,
)
from dispatcher.strictjson import dumps

log = logging.getLogger("dispatcher.store")
# Rows already reported unreadable: a listing reads them again and again.
_REPORTED: set[str] = set()
_REPORTED_MAX = 10_000

# json's C scanner, called directly: `json.loads` wraps it in two Python
# calls and two whitespace matches, and a task row holds four JSON columns
# read on every claim and end (issue 31). A text it does not read whole
# goes through `json.loads`, which says why.
# (typeshed leaves `scan_once` out: it is set in `JSONDecoder.__init__`.)
_SCAN_JSON: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]
# Enum lookups by value without `EnumMeta.__call__`.
_KINDS = {kind.value: kind for kind in Kind}
_STATES = {state.value: state for state in State}


def state_named(value: str) -> State | None:
    """The state a stored value names; None for a value no state has."""
    return _STATES.get(value)


class RowLike(Protocol):
    """sqlite3.Row, a psycopg dict row, or a plain dict."""

    def __getitem__(self, key: str, /) -> Any: ...


TASK_COLUMNS = (
    "seq",
    "id",
    "job_id",
    "model",
    "kind",
    "queue",
    "owner",
    "params",
    "fingerprint",
    "state",
    "stage",
    "attempt",
    "max_attempts",
    "cancel_requested",
    "force",
    "remote_id",
    "result",
    "error_kind",
    "error_message",
    "from_cache",
    "created_at",
    "started_at",
    "heartbeat_at",
    "finished_at",
    "not_before",
    "stage_started_at",
    "stage_durations",
    "ref",
    "host",
    "lease_token",
    "cost_estimate",
    "cost",
    "priority",
    "deadline_action",
    "deadline",
    "alt_queues",
    "skipped",
)


def _loads(text: str | bytes | None, default: Any, what: str, row_id: str) -> Any:
    """A stored JSON column, or `default` when it cannot be read.

    Rows outlive versions: one written before the strict-JSON checks (or
    damaged on disk) must not make every listing that includes it fail. Its
    other columns are still good, so the task shows, with this field empty.
    """
    if not text:
        return default
    try:
        if isinstance(text, str):
            try:
                value, end = _SCAN_JSON(text, 0)
                if end == len(text):
                    return value
            except StopIteration:
                pass  # not JSON at its first character: `json.loads` says so
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        if f"{row_id}:{what}" in _REPORTED or len(_REPORTED) >= _REPORTED_MAX:
            return default
        _REPORTED.add(f"{row_id}:{what}")
        log.warning(
            "task %s: stored %s is not readable JSON (%s); shown as empty",
            row_id,
            what,
            str(exc)[:80],
        )
        return default


# Fields a caller may change through update_task/claim_next, with their encoders.
_ENCODERS: dict[str, Any] = {
    "state": lambda v: State(v).value,
    "stage": lambda v: Stage(v).value if v is not None else None,
    "params": dumps,
    "result": lambda v: dumps(v) if v is not None else None,
    "stage_durations": dumps,
    "cancel_requested": int,
    "force": int,
    "from_cache": int,
    "kind": lambda v: Kind(v).value,
    "skipped": lambda v: dumps([skip.to_json() for skip in v]) if v else None,
}
UPDATABLE = frozenset(
    {
        "owner",
        "host",
        "lease_token",
        "state",
        "stage",
        "attempt",
        "max_attempts",
        "cancel_requested",
        "remote_id",
        "result",
        "error",
        "from_cache",
        "started_at",
        "heartbeat_at",
        "finished_at",
        "not_before",
        "stage_started_at",
        "stage_durations",
        "cost",
        # A fallback taken by another model's lane becomes that model's task.
        "model",
        "kind",
        "queue",
        "fingerprint",
        "skipped",
    }
)


def encode_changes(changes: Mapping[str, Any]) -> dict[str, Any]:
    """Field changes to column values; `error` becomes its two columns."""
    columns: dict[str, Any] = {}
    for name, value in changes.items():
        if name not in UPDATABLE:
            raise ValueError(f"task field {name!r} cannot be updated")
        if name == "error":
            columns["error_kind"] = value.kind if value else None
            columns["error_message"] = value.message if value else None
            continue
        encoder = _ENCODERS.get(name)
        columns[name] = encoder(value) if encoder else value
    return columns


def task_to_row(task: Task) -> dict[str, Any]:
    return {
        "id": task.id,
        "job_id": task.job_id,
        "model": task.model,
        "kind": task.kind.value,
        "queue": task.queue,
        "owner": task.owner,
        "params": dumps(task.params),
        "fingerprint": task.fingerprint,
        "state": task.state.value,
        "stage": task.stage.value if task.stage else None,
        "attempt": task.attempt,
        "max_attempts": task.max_attempts,
        "cancel_requested": int(task.cancel_requested),
        "force": int(task.force),
        "remote_id": task.remote_id,
        "result": dumps(task.result) if task.result is not None else None,
        "error_kind": task.error.kind if task.error else None,
        "error_message": task.error.message if task.error else None,
        "from_cache": int(task.from_cache),
        "created_at": task.created_at,
        "started_at": task.started_at,
        "heartbeat_at": task.heartbeat_at,
        "finished_at": task.finished_at,
        "not_before": task.not_before,
        "stage_started_at": task.stage_started_at,
        "stage_durations": dumps(task.stage_durations),
        "ref": task.ref,
        "host": task.host,
        "lease_token": task.lease_token,
        "cost_estimate": task.cost_estimate,
        "cost": task.cost,
        "priority": task.priority,
        "deadline_action": task.deadline_action,
        "deadline": task.deadline,
        "alt_queues": "|" + "|".join(task.alt_queues) + "|" if task.alt_queues else None,
        "skipped": _ENCODERS["skipped"](task.skipped),
    }


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _dict_or_none(value: Any) -> dict[str, Any] | None:
    return value if isinstance(value, dict) else None


def _stage(value: str | None, row_id: str) -> Stage | None:
    """The stored stage; one this version does not know (a newer one wrote it) is
    shown as none rather than failing every listing that includes the task."""
    if not value:
        return None
    try:
        return Stage(value)
    except ValueError:
        log.warning("task %s: unknown stored stage %r; shown as none", row_id, value[:40])
        return None


def _error(row: RowLike) -> TaskError | None:
    """The error columns of a task or attempt row, None when there was none."""
    if not row["error_kind"]:
        return None
    return TaskError(kind=row["error_kind"], message=row["error_message"] or "")


def row_to_task(row: RowLike) -> Task:
    if isinstance(row, sqlite3.Row):
        # sqlite3.Row finds a column by name with a scan of its columns:
        # some 40 reads of a 36-column row cost 4x more than one dict built.
        row = dict(zip(row.keys(), row, strict=True))
    return Task(
        seq=row["seq"],
        id=row["id"],
        job_id=row["job_id"],
        model=row["model"],
        kind=_KINDS.get(row["kind"]) or Kind(row["kind"]),
        queue=row["queue"],
        owner=row["owner"],
        params=_dict(_loads(row["params"], {}, "params", row["id"])),
        fingerprint=row["fingerprint"],
        state=_STATES.get(row["state"]) or State(row["state"]),
        stage=_stage(row["stage"], row["id"]),
        attempt=row["attempt"],
        max_attempts=row["max_attempts"],
        cancel_requested=bool(row["cancel_requested"]),
        force=bool(row["force"]),
        remote_id=row["remote_id"],
        result=_dict_or_none(_loads(row["result"], None, "result", row["id"])),
        error=_error(row),
        from_cache=bool(row["from_cache"]),
        created_at=row["created_at"],
        started_at=row["started_at"],
        heartbeat_at=row["heartbeat_at"],
        finished_at=row["finished_at"],
        not_before=row["not_before"],
        stage_started_at=row["stage_started_at"],
        stage_durations=_dict(_loads(row["stage_durations"], {}, "stage_durations", row["id"])),
        ref=row["ref"],
        host=row["host"],
        lease_token=row["lease_token"],
        cost_estimate=row["cost_estimate"],
        cost=row["cost"],
        priority=row["priority"] or 0,
        deadline_action=row["deadline_action"] or "run",
        deadline=row["deadline"],
        alt_queues=tuple(q for q in (row["alt_queues"] or "").split("|") if q),
        skipped=_skipped(_loads(row["skipped"], [], "skipped", row["id"])),
    )


def _skipped(value: Any) -> tuple[Skipped, ...]:
    items = value if isinstance(value, list) else []
    return tuple(
        Skipped(str(item.get("model", "")), str(item.get("reason", "")))
        for item in items
        if isinstance(item, dict)
    )


def attempt_to_row(attempt: Attempt) -> dict[str, Any]:
    return {
        "task_id": attempt.task_id,
        "attempt": attempt.attempt,
        "queue": attempt.queue,
        "owner": attempt.owner,
        "outcome": attempt.outcome.value,
        "started_at": attempt.started_at,
        "ended_at": attempt.ended_at,
        "error_kind": attempt.error.kind if attempt.error else None,
        "error_message": attempt.error.message if attempt.error else None,
        "stage_durations": dumps(attempt.stage_durations),
    }


def row_to_attempt(row: RowLike) -> Attempt:
    return Attempt(
        task_id=row["task_id"],
        attempt=row["attempt"],
        queue=row["queue"],
        owner=row["owner"],
        outcome=State(row["outcome"]),
        started_at=row["started_at"],
        ended_at=row["ended_at"],
        error=_error(row),
        stage_durations=_dict(
            _loads(row["stage_durations"], {}, "stage_durations", row["task_id"])
        ),
    )


def row_to_account(row: RowLike) -> Account:
    return Account(
        name=row["name"],
        kind=_KINDS.get(row["kind"]) or Kind(row["kind"]),
        enabled=bool(row["enabled"]),
        reason=row["reason"],
        needs_attention=bool(row["needs_attention"]),
        updated_at=row["updated_at"],
        cooldown_until=row["cooldown_until"],
    )


def row_to_cache_entry(row: RowLike) -> CacheEntry:
    return CacheEntry(
        fingerprint=row["fingerprint"],
        model=row["model"],
        result=json.loads(row["result"]),
        size_bytes=row["size_bytes"],
        created_at=row["created_at"],
        last_used_at=row["last_used_at"],
    )
