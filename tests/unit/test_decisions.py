from __future__ import annotations

from dispatcher.accounts.health import AccountState
from dispatcher.models import Kind, State, Task
from dispatcher.scheduling.decisions import (
    LaneSnapshot,
    RecoveryAction,
    ServingLane,
    eta_s,
    free_slots,
    overdue_s,
    plan_reclaims,
    plan_recovery,
    why_waiting,
)


def _task(**changes: object) -> Task:
    base = Task(
        id="t1",
        model="m",
        kind=Kind.API,
        queue="api:p",
        params={},
        fingerprint="f",
        created_at=1000.0,
        state=State.RUNNING,
        started_at=1000.0,
        heartbeat_at=1000.0,
    )
    return base.replace(**changes)


def test_disabled_lane_starts_nothing_and_full_lane_has_no_slot() -> None:
    assert free_slots(LaneSnapshot("api:p", concurrency=3, enabled=True, running=1)) == 2
    assert free_slots(LaneSnapshot("api:p", concurrency=3, enabled=True, running=3)) == 0
    assert free_slots(LaneSnapshot("api:p", concurrency=3, enabled=False, running=0)) == 0


def test_reclaim_only_after_the_stale_bound() -> None:
    fresh = _task(id="fresh", heartbeat_at=1000.0)
    stale = _task(id="stale", heartbeat_at=909.0)
    plans = plan_reclaims([fresh, stale], now=1000.0, stale_after_s=90.0, retry_delay_s=5.0)
    assert [p.task_id for p in plans] == ["stale"]
    assert plans[0].next_state is State.PENDING and plans[0].next_attempt == 2


def test_reclaim_of_last_attempt_fails_the_task() -> None:
    (plan,) = plan_reclaims(
        [_task(attempt=3, heartbeat_at=0.0)], now=1000.0, stale_after_s=90.0, retry_delay_s=5.0
    )
    assert plan.next_state is State.FAILED and plan.next_attempt == 3


def test_recovery_rules() -> None:
    now = 2000.0
    assert (
        plan_recovery(_task(remote_id="r1"), now=now, expire_after_s=7200) is RecoveryAction.RESUME
    )
    assert plan_recovery(_task(), now=now, expire_after_s=7200) is RecoveryAction.REQUEUE
    assert plan_recovery(_task(kind=Kind.WEB), now=now, expire_after_s=7200) is RecoveryAction.STALE
    old = _task(started_at=now - 7201, remote_id="r1")
    assert plan_recovery(old, now=now, expire_after_s=7200) is RecoveryAction.EXPIRE


def test_eta_uses_median_and_waves_of_concurrency() -> None:
    durations = [10.0, 10.0, 400.0]  # one outlier must not dominate
    assert eta_s(ahead=0, concurrency=3, recent_durations_s=durations) == 10.0
    assert eta_s(ahead=5, concurrency=3, recent_durations_s=durations) == 20.0
    assert eta_s(ahead=0, concurrency=1, recent_durations_s=durations, running_elapsed_s=4.0) == 6.0
    assert eta_s(ahead=2, concurrency=1, recent_durations_s=[]) is None


def test_a_running_task_past_its_estimate_is_overdue_not_done() -> None:
    durations = [10.0, 12.0, 8.0]
    assert eta_s(ahead=0, concurrency=1, recent_durations_s=durations, running_elapsed_s=25.0) == 0
    assert overdue_s(recent_durations_s=durations, running_elapsed_s=25.0) == 15.0
    assert overdue_s(recent_durations_s=durations, running_elapsed_s=4.0) is None
    assert overdue_s(recent_durations_s=[], running_elapsed_s=400.0) is None


def test_a_task_no_lane_can_take_says_why_instead_of_an_eta() -> None:
    off = ServingLane("api:demo", AccountState.DISABLED, "quota used up")
    stuck = ServingLane("web:acct-1", AccountState.NEEDS_ATTENTION, "logged out")
    stuck2 = ServingLane("web:acct-2", AccountState.NEEDS_ATTENTION, None)
    cooling = ServingLane("web:acct-3", AccountState.COOLDOWN, "429")
    fine = ServingLane("web:acct-4", AccountState.OK)
    assert why_waiting([off]) == "cannot run: lane api:demo is disabled (quota used up)"
    assert why_waiting([stuck, stuck2]) == (
        "cannot run: every account needs attention "
        "(web:acct-1 needs attention (logged out); web:acct-2 needs attention)"
    )
    assert why_waiting([off, stuck]) == (
        "cannot run: no lane can take it "
        "(api:demo is disabled (quota used up); web:acct-1 needs attention (logged out))"
    )
    # A cooldown ends by itself, an open lane takes it, another host's lane may.
    assert why_waiting([stuck, cooling]) is None
    assert why_waiting([off, fine]) is None
    assert why_waiting([off], others_serving=1) is None
    # No lane here at all is the "model not loaded" note's to say.
    assert why_waiting([]) is None


def test_a_running_task_with_known_progress_is_estimated_from_it_never_overdue() -> None:
    durations = [2.0, 2.0, 2.0]  # earlier runs were short; this one is long
    eta = eta_s(
        ahead=0,
        concurrency=1,
        recent_durations_s=durations,
        running_elapsed_s=10.0,
        progress_pct=25.0,
    )
    assert eta == 30.0  # 25 % took 10 s: 75 % takes 30 s more
    assert (
        overdue_s(recent_durations_s=durations, running_elapsed_s=10.0, progress_pct=25.0) is None
    )
    # Without progress (or before it starts) the model's history still decides.
    assert eta_s(ahead=0, concurrency=1, recent_durations_s=durations, running_elapsed_s=10.0) == 0
    assert overdue_s(recent_durations_s=durations, running_elapsed_s=10.0, progress_pct=0.0) == 8.0
