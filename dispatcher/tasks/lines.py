"""The log lines about tasks: where a line places a task, its fields, one per change.

Every line carries the lane prefix for people and `lane`/`task_id` (and the
attempt, states and stage) as `extra` fields for `JsonFormatter`.
"""

from __future__ import annotations

import logging
from typing import Any

from dispatcher.models import Kind, State, Task

log = logging.getLogger("dispatcher.tasks")


def lane_of(task: Task) -> str:
    """Where a log line places a task: its lane once claimed, its queue before."""
    if task.kind is Kind.WEB:
        return f"web:{task.owner or task.model}"
    # The provider once claimed (its lane's name); the model's queue before.
    return f"api:{task.owner}" if task.owner else task.queue


def lane_prefix(task: Task) -> str:
    return f"[{lane_of(task)}]"


def log_fields(task: Task, **more: Any) -> dict[str, Any]:
    """The structured fields of a log line about a task (`extra`; see `dispatcher.logs`)."""
    return {"lane": lane_of(task), "task_id": task.id, **more}


def log_rejected(
    task: Task, new_state: State, current: Task | None, why: str, *, fenced: bool
) -> None:
    """The line of a write the store refused: a lease moved on, or the row did."""
    if (
        current is not None
        and current.state is task.state
        and current.attempt == task.attempt
        and fenced
    ):
        # The row has not moved: the account's lease has (another host
        # holds it now, with a newer token).
        log.warning(
            "%s task %s attempt %d: write %s->%s dropped: account %r lease token %s "
            "is no longer held by this host%s",
            lane_prefix(task),
            task.id,
            task.attempt,
            task.state.value,
            new_state.value,
            task.owner,
            task.lease_token,
            f": {why}" if why else "",
            extra=log_fields(task, attempt=task.attempt),
        )
        return
    log.warning(
        "%s task %s attempt %d: late write %s->%s rejected (now %s attempt %s)%s",
        lane_prefix(task),
        task.id,
        task.attempt,
        task.state.value,
        new_state.value,
        current.state.value if current else "missing",
        current.attempt if current else "-",
        f": {why}" if why else "",
        extra=log_fields(task, attempt=task.attempt),
    )


def log_transition(task: Task, old: State | None, why: str = "") -> None:
    """The one line of a state change, with its fields as `extra` (see `dispatcher.logs`)."""
    # Every transition passes here: build the line only when it is written.
    if log.isEnabledFor(logging.INFO):
        stage = task.stage.value if task.stage else None
        lane = lane_of(task)
        log.info(
            "[%s] task %s attempt %d/%d %s%s stage=%s%s",
            lane,
            task.id,
            task.attempt,
            task.max_attempts,
            f"{old.value}->" if old else "new ",
            task.state.value,
            stage or "-",
            f" ({why})" if why else "",
            extra={
                "lane": lane,
                "task_id": task.id,
                "attempt": task.attempt,
                "max_attempts": task.max_attempts,
                "from_state": old.value if old else None,
                "state": task.state.value,
                "stage": stage,
            },
        )
