"""The pure health decisions: state, usage-cap resets, streaks, adaptive concurrency."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from dispatcher.accounts.health import (
    SUCCESSES_TO_GROW,
    THROTTLES_TO_SHRINK,
    AccountState,
    Streak,
    Throttle,
    after_call,
    after_outcome,
    cooldown_until,
    parse_reset,
    state_of,
)
from dispatcher.models import Account, Kind

NOW = datetime(2026, 12, 1, 10, 0, tzinfo=UTC).timestamp()  # 10:00 UTC
nows = st.floats(min_value=1.7e9, max_value=2.0e9, allow_nan=False)


def _account(**changes: object) -> Account:
    account = Account(name="a", kind=Kind.WEB)
    for key, value in changes.items():
        setattr(account, key, value)
    return account


def test_the_operator_switch_outranks_attention_and_cooldown() -> None:
    both = _account(enabled=False, needs_attention=True, cooldown_until=NOW + 60, reason="x")
    assert state_of(both, NOW).state is AccountState.DISABLED
    attention = _account(needs_attention=True, cooldown_until=NOW + 60, reason="captcha")
    assert (state_of(attention, NOW).state, state_of(attention, NOW).reason) == (
        AccountState.NEEDS_ATTENTION,
        "captcha",
    )


def test_a_cooldown_ends_by_itself_at_until() -> None:
    cooling = _account(cooldown_until=NOW + 60, reason="usage limit")
    view = state_of(cooling, NOW)
    assert (view.state, view.until, view.open) == (AccountState.COOLDOWN, NOW + 60, False)
    after = state_of(cooling, NOW + 60)
    assert (after.state, after.until, after.reason, after.open) == (
        AccountState.OK,
        None,
        None,
        True,
    )


def _at(hour: int, minute: int, day: int = 1) -> float:
    return datetime(2026, 12, day, hour, minute, tzinfo=UTC).timestamp()


def test_reset_forms_sites_use() -> None:
    assert parse_reset("Try again in 3 hours.", NOW) == NOW + 3 * 3600
    assert parse_reset("try again in 45 minutes", NOW) == NOW + 45 * 60
    assert parse_reset("in an hour", NOW) == NOW + 3600
    assert parse_reset("You've reached your limit, try again after 2:14 PM", NOW) == _at(14, 14)
    assert parse_reset("resets at 14:00 UTC", NOW) == _at(14, 0)
    # A time already past today is tomorrow's.
    assert parse_reset("after 9:30 AM", NOW) == _at(9, 30, day=2)
    assert parse_reset("after 12:05 AM", NOW) == _at(0, 5, day=2)
    assert parse_reset("Come back tomorrow", NOW) == _at(0, 0, day=2)
    assert parse_reset("tomorrow at 8:00 AM", NOW) == _at(8, 0, day=2)
    assert parse_reset("You have hit the cap.", NOW) is None
    assert parse_reset("at 3", NOW) is None  # too vague
    assert parse_reset("after 13:00 PM", NOW) is None  # not a time


@given(now=nows, text=st.text(max_size=80))
def test_a_reset_is_never_in_the_past(now: float, text: str) -> None:
    reset = parse_reset(text, now)
    assert reset is None or reset >= now
    assert cooldown_until(text, now, 3600.0) > now


@given(now=nows, hour=st.integers(0, 23), minute=st.integers(0, 59))
def test_a_clock_time_lands_within_a_day_on_that_time(now: float, hour: int, minute: int) -> None:
    reset = parse_reset(f"Try again at {hour:02d}:{minute:02d} UTC.", now)
    assert reset is not None and now < reset <= now + 86400
    when = datetime.fromtimestamp(reset, UTC)
    assert (when.hour, when.minute) == (hour, minute)


@given(now=nows, amount=st.integers(1, 10_000), unit=st.sampled_from(["minutes", "hours"]))
def test_a_relative_reset_is_that_far_ahead(now: float, amount: int, unit: str) -> None:
    factor = 60 if unit == "minutes" else 3600
    assert parse_reset(f"in {amount} {unit}", now) == now + amount * factor


def test_same_class_failures_in_a_row_need_attention() -> None:
    first = after_outcome(None, "timeout", 3)
    second = after_outcome(first.streak, "timeout", 3)
    assert (first.attention, second.attention, second.streak) == (None, None, Streak("timeout", 2))
    third = after_outcome(second.streak, "timeout", 3)
    assert third.attention == "3 timeout failures in a row"
    assert third.streak is None  # counting starts over


def test_another_class_or_a_success_breaks_the_streak() -> None:
    two = after_outcome(after_outcome(None, "timeout", 3).streak, "timeout", 3).streak
    assert after_outcome(two, "page_error", 3).streak == Streak("page_error", 1)
    assert after_outcome(two, None, 3) == after_outcome(None, None, 3)
    assert after_outcome(two, None, 3).streak is None


@given(quota=st.integers(1, 64), calls=st.lists(st.booleans(), max_size=200))
def test_effective_concurrency_stays_within_one_and_the_quota(
    quota: int, calls: list[bool]
) -> None:
    throttle = Throttle(effective=quota)
    for throttled in calls:
        throttle = after_call(throttle, quota, throttled=throttled)
        assert 1 <= throttle.effective <= quota


def test_a_storm_halves_and_successes_grow_back_by_one() -> None:
    throttle = Throttle(effective=8)
    for _ in range(THROTTLES_TO_SHRINK):
        throttle = after_call(throttle, 8, throttled=True)
    assert throttle.effective == 4
    for _ in range(THROTTLES_TO_SHRINK):
        throttle = after_call(throttle, 8, throttled=True)
    assert throttle.effective == 2
    for _ in range(SUCCESSES_TO_GROW - 1):
        throttle = after_call(throttle, 8, throttled=False)
    assert throttle.effective == 2
    throttle = after_call(throttle, 8, throttled=False)
    assert throttle.effective == 3


def test_one_429_is_a_hiccup_not_a_storm() -> None:
    throttle = after_call(Throttle(effective=4), 4, throttled=True)
    assert throttle.effective == 4
    assert after_call(throttle, 4, throttled=False).throttles == 0
