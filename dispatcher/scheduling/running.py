"""One running attempt as the scheduler holds it in memory, and its helpers.

`Running` ties a claimed task to its lane, run context and live progress;
`Live` keeps the fast-changing stage and progress (only the stage reaches
the store, lazily); `TaskLog` tags a runner's lines with lane, task and
attempt; `disk_full_error` names a full results disk behind a failure;
`unrecorded` says how an attempt ends when its outcome could not be written.
"""

from __future__ import annotations

import errno
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dispatcher.errors import PermanentError, RunError, TransientError
from dispatcher.models import Stage, Task
from dispatcher.scheduling.lanes import LaneSpec
from dispatcher.scheduling.protocol import RunContext, RunResult

_DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def disk_full_error(exc: BaseException, result_dir: Path) -> PermanentError | None:
    """The attempt's failure as `disk_full` when a full disk is behind it, else None.

    Looks through the chain of causes: a runner may have wrapped the OSError.
    Permanent on purpose: the generation already ran (and may have been
    paid for); another attempt would run it again only to meet the same
    full disk. The operator frees space and retries the task.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in _DISK_FULL_ERRNOS:
            where = current.filename or result_dir
            return PermanentError(
                f"the results disk is full: cannot write the result under {where} "
                f"({current.strerror}); free space there, then retry the task",
                kind="disk_full",
            )
        current = current.__cause__ or current.__context__
    return None


class TaskLog(logging.LoggerAdapter[logging.Logger]):
    """Prefixes a runner's log lines with lane, task and attempt (the lane
    alone for work on a lane before any task: a browser started as it opens)."""

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        extra = self.extra or {}
        kwargs.setdefault("extra", {}).update(extra)
        if "task_id" not in extra:
            return f"[{extra['lane']}] {msg}", kwargs
        return (
            f"[{extra['lane']}] task {extra['task_id']} attempt {extra['attempt']}: {msg}",
            kwargs,
        )


@dataclass
class Live:
    """Fast-changing progress kept in memory; only stage reaches the store, lazily."""

    stage: Stage = Stage.DISPATCHED
    progress: float | None = None
    queue_position: int | None = None
    # When progress was first reported (epoch s): an ETA from progress
    # counts from there, not from time spent waiting in a vendor's queue.
    progress_since: float | None = None
    stage_started: float = 0.0
    durations: dict[str, float] = field(default_factory=dict)

    def enter(self, stage: Stage, now: float) -> None:
        if stage is not self.stage:
            self.durations[self.stage.value] = (
                self.durations.get(self.stage.value, 0.0) + now - self.stage_started
            )
            self.stage = stage
            self.stage_started = now

    def closed_durations(self, now: float) -> dict[str, float]:
        closed = dict(self.durations)
        closed[self.stage.value] = closed.get(self.stage.value, 0.0) + now - self.stage_started
        return closed


@dataclass
class Running:
    task: Task
    lane: LaneSpec
    ctx: RunContext
    live: Live
    started_monotonic: float = 0.0  # the context's last beat when the run began
    late_beat: bool = False  # found stale in the store while alive here (`stalelook`)

    @property
    def resumable(self) -> bool:
        """A retry can resume its remote job: it has one, and one provider
        serves the model (another's lane could claim the retry, and cannot
        resume a job it never made)."""
        return bool(self.task.remote_id) and len(self.ctx.profile.provider_names) == 1

    @property
    def withdrawn(self) -> bool:
        """Reclaimed or being shut down: the run's ending writes no verdict."""
        reason = self.ctx.interruption
        return reason is not None and reason.withdraws


@dataclass(frozen=True)
class Canceled:
    """The runner stopped at a checkpoint after a cancel was asked for."""


# How one run ended, as the scheduler records it.
Outcome = RunResult | RunError | Canceled


# What of a failed write's own message the fallback record keeps.
_WRITE_ERROR_CHARS = 200


def unrecorded(outcome: RunResult | RunError, exc: BaseException, *, resumable: bool) -> RunError:
    """The error an attempt ends with when writing its outcome failed.

    It carries none of what the run reported (that may be what the store
    refused), only what it was and why the write failed. A result whose
    remote job can be resumed is fetched again by the next attempt (the
    caller keeps the remote id: no second submit, no second bill); any
    other result is not run again by itself, since it ran and may have been
    paid for. An error keeps its kind and its retry rule.

    `resumable`: see `Running.resumable`.
    """
    why = f"{type(exc).__name__}: {exc}"[:_WRITE_ERROR_CHARS]
    if isinstance(outcome, RunError):
        cls = TransientError if outcome.retryable else PermanentError
        return cls(f"{outcome.kind}; its message could not be recorded ({why})", kind=outcome.kind)
    if resumable:
        return TransientError(
            f"the result could not be recorded ({why}); the next attempt fetches it "
            "again from the same remote job",
            kind="record_failed",
        )
    return PermanentError(
        f"the result could not be recorded ({why}); not run again by itself, since it "
        "ran once already: retry the task to run it again",
        kind="record_failed",
    )
