"""Start-up recovery's per-task decision (dispatcher/hosts/recovery.py)."""

from __future__ import annotations

from dispatcher.hosts.recovery import decide
from dispatcher.models import Kind, State, Task
from dispatcher.scheduling.decisions import RecoveryAction


def _task(kind: Kind = Kind.API, attempt: int = 1, remote_id: str | None = None) -> Task:
    return Task(
        id="t1",
        model="m",
        kind=kind,
        queue="api-model:m",
        params={},
        fingerprint="f",
        created_at=1000.0,
        started_at=1000.0,
        heartbeat_at=1090.0,
        state=State.RUNNING,
        attempt=attempt,
        max_attempts=3,
        remote_id=remote_id,
    )


def test_a_web_task_is_stale_at_once_and_retried_by_the_retry_rule() -> None:
    fate = decide(_task(kind=Kind.WEB), now=1100.0, expire_after_s=7200, retry_delay_s=5)
    assert fate.action is RecoveryAction.STALE
    assert fate.reclaim is not None
    assert (fate.reclaim.next_state, fate.reclaim.next_attempt) == (State.PENDING, 2)
    assert fate.reclaim.not_before == 1105.0


def test_a_web_task_on_its_last_attempt_fails() -> None:
    fate = decide(_task(kind=Kind.WEB, attempt=3), now=1100.0, expire_after_s=7200, retry_delay_s=5)
    assert fate.reclaim is not None and fate.reclaim.next_state is State.FAILED


def test_api_tasks_resume_or_requeue_and_old_ones_expire() -> None:
    resume = decide(_task(remote_id="r1"), now=1100.0, expire_after_s=7200, retry_delay_s=5)
    assert resume == type(resume)(RecoveryAction.RESUME)
    assert decide(_task(), now=1100.0, expire_after_s=7200, retry_delay_s=5).action is (
        RecoveryAction.REQUEUE
    )
    old = decide(_task(kind=Kind.WEB), now=9000.0, expire_after_s=7200, retry_delay_s=5)
    assert (old.action, old.reclaim) == (RecoveryAction.EXPIRE, None)


def test_a_recovered_web_task_says_its_runner_ended_not_a_negative_bound() -> None:
    fate = decide(_task(kind=Kind.WEB), now=1100.0, expire_after_s=7200, retry_delay_s=5)
    assert fate.reclaim is not None
    assert fate.reclaim.reason == (
        "its runner ended with the previous run (last heartbeat 10.0s ago)"
    )
    assert "-1.0" not in fate.reclaim.reason
