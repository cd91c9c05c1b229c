"""The state guard: which transitions may happen, decided in this one place.

    pending ──claim──▶ running ──▶ success        (terminal, never overwritten)
       │                  │  ├───▶ failed ──retry──▶ pending
       │                  │  └───▶ canceled       (terminal, never overwritten)
       └──cancel──▶ canceled
    running ──▶ pending   (interrupted before it could matter: shutdown, crash
                           before submit, retryable failure with attempts left)

Every write the ledger makes is checked here first and then applied by the
store as a compare-and-set on the expected old state.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from dispatcher.errors import StateConflict
from dispatcher.models import JobState, State

ALLOWED: Mapping[State, frozenset[State]] = {
    State.PENDING: frozenset({State.RUNNING, State.CANCELED}),
    State.RUNNING: frozenset(
        {State.RUNNING, State.SUCCESS, State.FAILED, State.CANCELED, State.PENDING}
    ),
    State.FAILED: frozenset({State.PENDING}),
    State.SUCCESS: frozenset(),
    State.CANCELED: frozenset(),
}


def check_transition(old: State, new: State) -> None:
    if new not in ALLOWED[old]:
        raise StateConflict(f"a {old.value} task cannot become {new.value}")


def check_cancel(state: State) -> None:
    if state not in (State.PENDING, State.RUNNING):
        raise StateConflict(
            f"only pending or running tasks can be canceled; this one is {state.value}"
        )


def check_retry(state: State) -> None:
    if state is not State.FAILED:
        raise StateConflict(f"only failed tasks can be retried; this one is {state.value}")


@dataclass(frozen=True)
class AfterFailure:
    """What a failed attempt leads to."""

    state: State  # PENDING (another attempt) or FAILED
    attempt: int
    not_before: float


def after_failure(
    *, attempt: int, max_attempts: int, retryable: bool, now: float, retry_delay_s: float
) -> AfterFailure:
    """A retryable failure with attempts left goes back to pending after a delay."""
    if retryable and attempt < max_attempts:
        # Grow the delay with each attempt so a struggling backend gets room.
        delay_s = retry_delay_s * (2 ** (attempt - 1))
        return AfterFailure(State.PENDING, attempt + 1, now + delay_s)
    return AfterFailure(State.FAILED, attempt, 0.0)


@dataclass(frozen=True)
class ManualRetry:
    attempt: int
    max_attempts: int


def manual_retry(*, attempt: int, max_attempts: int) -> ManualRetry:
    """An operator's retry always earns one more attempt, never more than that."""
    next_attempt = attempt + 1
    return ManualRetry(attempt=next_attempt, max_attempts=max(max_attempts, next_attempt))


def job_state(counts: Mapping[State, int]) -> JobState:
    """Overall state of a job from its per-state counts."""
    total = sum(counts.values())
    if total == 0 or counts.get(State.PENDING, 0) or counts.get(State.RUNNING, 0):
        return JobState.RUNNING
    for state, job in (
        (State.SUCCESS, JobState.SUCCESS),
        (State.FAILED, JobState.FAILED),
        (State.CANCELED, JobState.CANCELED),
    ):
        if counts.get(state, 0) == total:
            return job
    return JobState.PARTIAL
