from __future__ import annotations

import pytest

from dispatcher.errors import StateConflict
from dispatcher.models import JobState, State
from dispatcher.tasks.states import (
    after_failure,
    check_cancel,
    check_retry,
    check_transition,
    job_state,
    manual_retry,
)


@pytest.mark.parametrize("terminal", [State.SUCCESS, State.CANCELED])
@pytest.mark.parametrize("new", list(State))
def test_success_and_canceled_are_never_overwritten(terminal: State, new: State) -> None:
    with pytest.raises(StateConflict):
        check_transition(terminal, new)


def test_only_pending_or_running_can_be_canceled() -> None:
    check_cancel(State.PENDING)
    check_cancel(State.RUNNING)
    for state in (State.SUCCESS, State.FAILED, State.CANCELED):
        with pytest.raises(StateConflict, match="only pending or running"):
            check_cancel(state)


def test_only_failed_can_be_retried() -> None:
    check_retry(State.FAILED)
    for state in (State.PENDING, State.RUNNING, State.SUCCESS, State.CANCELED):
        with pytest.raises(StateConflict, match="only failed"):
            check_retry(state)


def test_retryable_failure_requeues_with_growing_delay_until_attempts_run_out() -> None:
    first = after_failure(attempt=1, max_attempts=3, retryable=True, now=100.0, retry_delay_s=5.0)
    assert (first.state, first.attempt, first.not_before) == (State.PENDING, 2, 105.0)
    second = after_failure(attempt=2, max_attempts=3, retryable=True, now=100.0, retry_delay_s=5.0)
    assert (second.state, second.attempt, second.not_before) == (State.PENDING, 3, 110.0)
    last = after_failure(attempt=3, max_attempts=3, retryable=True, now=100.0, retry_delay_s=5.0)
    assert (last.state, last.attempt) == (State.FAILED, 3)


def test_permanent_failure_fails_at_once() -> None:
    fate = after_failure(attempt=1, max_attempts=3, retryable=False, now=0.0, retry_delay_s=5.0)
    assert (fate.state, fate.attempt) == (State.FAILED, 1)


def test_manual_retry_grants_exactly_one_more_attempt() -> None:
    plan = manual_retry(attempt=3, max_attempts=3)
    assert (plan.attempt, plan.max_attempts) == (4, 4)
    plan = manual_retry(attempt=1, max_attempts=3)
    assert (plan.attempt, plan.max_attempts) == (2, 3)


@pytest.mark.parametrize(
    ("counts", "expected"),
    [
        ({State.PENDING: 1, State.SUCCESS: 3}, JobState.RUNNING),
        ({State.RUNNING: 1}, JobState.RUNNING),
        ({State.SUCCESS: 4}, JobState.SUCCESS),
        ({State.FAILED: 2}, JobState.FAILED),
        ({State.CANCELED: 2}, JobState.CANCELED),
        ({State.SUCCESS: 2, State.FAILED: 1}, JobState.PARTIAL),
        ({State.SUCCESS: 2, State.CANCELED: 1}, JobState.PARTIAL),
    ],
)
def test_job_state_from_counts(counts: dict[State, int], expected: JobState) -> None:
    assert job_state(counts) is expected
