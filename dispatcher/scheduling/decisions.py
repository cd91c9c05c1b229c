"""Scheduling decisions as pure functions over a snapshot and the clock's `now`.

Nothing here does I/O: the scheduler gathers a snapshot, asks these functions
what to do, and carries out the answer.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from dispatcher.accounts.health import AccountState
from dispatcher.models import Kind, State, Task
from dispatcher.tasks.states import after_failure

# Nominal seconds from production experience; the clock's time_scale shrinks them.
HEARTBEAT_INTERVAL_S = 15.0
STALE_AFTER_S = 90.0  # six missed heartbeats
EXPIRE_AFTER_S = 2 * 3600.0  # nothing legitimately runs this long
DEDUP_WINDOW_S = 30.0


@dataclass(frozen=True)
class LaneSnapshot:
    name: str
    concurrency: int
    enabled: bool
    running: int


def free_slots(lane: LaneSnapshot) -> int:
    """How many tasks the lane may start now; a disabled lane starts none."""
    if not lane.enabled:
        return 0
    return max(0, lane.concurrency - lane.running)


@dataclass(frozen=True)
class Reclaim:
    task_id: str
    attempt: int
    next_state: State  # PENDING (retry) or FAILED
    next_attempt: int
    not_before: float
    reason: str


def plan_reclaims(
    running: Sequence[Task], *, now: float, stale_after_s: float, retry_delay_s: float
) -> list[Reclaim]:
    """Running tasks whose heartbeat is older than the stale bound, and their fate."""
    plans = []
    for task in running:
        if _silent_s(task, now) <= stale_after_s:
            continue
        plans.append(
            reclaim_plan(task, now=now, retry_delay_s=retry_delay_s, stale_after_s=stale_after_s)
        )
    return plans


def alive_here(*, beats_required: bool, silent_s: float, stale_after_s: float) -> bool:
    """A run of this host's own whose heartbeat in the store is stale: is the
    run itself alive? Then only its beat was late (this host's loop starved
    or paused, the database slow), and it is left running, not reclaimed.

    A runner that needs no beats is proven alive by its running coroutine
    (it bounds each of its calls); one that does (a browser page can freeze)
    is alive only if it said so (`ctx.beat`) within the stale bound: `silent_s`
    on this host's own clock.
    """
    return not beats_required or silent_s <= stale_after_s


def _silent_s(task: Task, now: float) -> float:
    last = next(t for t in (task.heartbeat_at, task.started_at, task.created_at) if t is not None)
    return now - last


def reclaim_plan(
    task: Task, *, now: float, retry_delay_s: float, stale_after_s: float | None = None
) -> Reclaim:
    """A stale running task's fate: the retry rule, as for any retryable failure.

    `stale_after_s` only words the reason. Recovery passes none: it calls this
    for a task whose runner ended with the previous run (or its dead host),
    whatever its heartbeat, and the reason says that instead of a bound.
    """
    silent_s = _silent_s(task, now)
    fate = after_failure(
        attempt=task.attempt,
        max_attempts=task.max_attempts,
        retryable=True,
        now=now,
        retry_delay_s=retry_delay_s,
    )
    return Reclaim(
        task_id=task.id,
        attempt=task.attempt,
        next_state=fate.state,
        next_attempt=fate.attempt,
        not_before=fate.not_before,
        reason=(
            f"no heartbeat for {silent_s:.1f}s (stale after {stale_after_s:.1f}s)"
            if stale_after_s is not None
            else f"its runner ended with the previous run (last heartbeat {silent_s:.1f}s ago)"
        ),
    )


class RecoveryAction(StrEnum):
    RESUME = "resume"  # API job with a remote id: ask the provider, keep polling
    REQUEUE = "requeue"  # never reached the remote side: pending on the same attempt
    STALE = "stale"  # web task whose browser died with us: the retry rule decides
    EXPIRE = "expire"  # running for over two hours: failed as expired


def plan_recovery(task: Task, *, now: float, expire_after_s: float) -> RecoveryAction:
    """What start-up does with a task that a previous run left `running`."""
    started = task.started_at or task.created_at
    if now - started > expire_after_s:
        return RecoveryAction.EXPIRE
    if task.kind is Kind.WEB:
        return RecoveryAction.STALE
    if task.remote_id:
        return RecoveryAction.RESUME
    return RecoveryAction.REQUEUE


def eta_s(
    *,
    ahead: int,
    concurrency: int,
    recent_durations_s: Sequence[float],
    running_elapsed_s: float | None = None,
    progress_pct: float | None = None,
) -> float | None:
    """Seconds until the task should finish, from the model's recent run times.

    The median resists the field's outliers (web runs span 31 s to 370 s).
    None when the model has no history yet: a made-up number would mislead.
    A running task whose progress is known (e.g. ComfyUI's sampler steps)
    is estimated from that progress and its elapsed time instead: the
    server's own count beats the model's history, and the two never
    contradict each other ("55 %" beside "overdue").
    """
    from_progress = _eta_from_progress_s(running_elapsed_s, progress_pct)
    if from_progress is not None:
        return from_progress
    if not recent_durations_s:
        return None
    typical_s = statistics.median(recent_durations_s)
    if running_elapsed_s is not None:
        return max(0.0, typical_s - running_elapsed_s)
    waves = ahead // max(1, concurrency) + 1
    return waves * typical_s


def _eta_from_progress_s(elapsed_s: float | None, progress_pct: float | None) -> float | None:
    """Remaining seconds at the pace so far; None unless progress has begun."""
    if elapsed_s is None or progress_pct is None or not 0 < progress_pct <= 100:
        return None
    return max(0.0, elapsed_s * (100.0 - progress_pct) / progress_pct)


def overdue_s(
    *,
    recent_durations_s: Sequence[float],
    running_elapsed_s: float,
    progress_pct: float | None = None,
) -> float | None:
    """Seconds a running task is past its estimate (`eta_s` stops at 0); None if not past it.

    Never overdue while progress is known: the estimate then follows it.
    """
    if not recent_durations_s or _eta_from_progress_s(running_elapsed_s, progress_pct) is not None:
        return None
    late_s = running_elapsed_s - statistics.median(recent_durations_s)
    return late_s if late_s > 0 else None


@dataclass(frozen=True)
class ServingLane:
    """A lane serving a waiting task's queue, as `why_waiting` sees it."""

    name: str
    state: AccountState
    reason: str | None = None


def why_waiting(lanes: Sequence[ServingLane], *, others_serving: int = 0) -> str | None:
    """Why a waiting task cannot start by itself, or None when it can.

    An ETA for a task whose every lane is disabled or needs a person would be
    a promise nobody keeps: the answer says why instead. A cooldown ends by
    itself, so it is no reason; a lane of another host running the queue
    (`others_serving`) can take it; no lane here at all is said elsewhere
    (the model is not loaded on this host)."""
    if not lanes or others_serving > 0:
        return None
    # An unreachable provider is tried again by itself, as a cooldown ends.
    if any(
        lane.state in (AccountState.OK, AccountState.COOLDOWN, AccountState.UNREACHABLE)
        for lane in lanes
    ):
        return None

    def said(lane: ServingLane) -> str:
        what = "is disabled" if lane.state is AccountState.DISABLED else "needs attention"
        return f"{lane.name} {what}" + (f" ({lane.reason})" if lane.reason else "")

    if len(lanes) == 1:
        return f"cannot run: lane {said(lanes[0])}"
    if all(lane.state is AccountState.NEEDS_ATTENTION for lane in lanes):
        return f"cannot run: every account needs attention ({'; '.join(map(said, lanes))})"
    if all(lane.state is AccountState.DISABLED for lane in lanes):
        return f"cannot run: every lane is disabled ({'; '.join(map(said, lanes))})"
    return f"cannot run: no lane can take it ({'; '.join(map(said, lanes))})"
