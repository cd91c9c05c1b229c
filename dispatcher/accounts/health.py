"""Pure decisions about a lane's health: its visible state, usage-cap resets,
failure streaks and adaptive concurrency. No I/O; time comes in as numbers.

An account (web) or provider (API) is in exactly one state:

    disabled         the operator's switch is off (the final word)
    needs_attention  something only an operator can fix (logged out, a human
                     check, a revoked key, a run of identical failures)
    cooldown         a usage cap: it opens again by itself at `until`
    ok               it takes tasks
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from dispatcher.models import Account

DEFAULT_COOLDOWN_S = 3600.0  # a cap that shows no reset time: try again in an hour
DEFAULT_FAILURES_FOR_ATTENTION = 3
# Successes in a row after which a lane halved by 429s gets one slot back.
SUCCESSES_TO_GROW = 5
# 429s without Retry-After in a row that make a storm (one is a hiccup).
THROTTLES_TO_SHRINK = 2


class AccountState(enum.StrEnum):
    OK = "ok"
    COOLDOWN = "cooldown"
    NEEDS_ATTENTION = "needs_attention"
    DISABLED = "disabled"
    # A provider whose server refuses connections (in memory only: it
    # clears by itself once the server answers again).
    UNREACHABLE = "unreachable"


@dataclass(frozen=True)
class StateView:
    state: AccountState
    until: float | None  # epoch seconds; only while cooling down
    reason: str | None
    since: float | None = None  # epoch seconds; only while unreachable

    @property
    def open(self) -> bool:
        return self.state is AccountState.OK


def state_of(account: Account, now: float) -> StateView:
    """The one visible state; the operator's switch outranks everything else."""
    if not account.enabled:
        return StateView(AccountState.DISABLED, None, account.reason)
    if account.needs_attention:
        return StateView(AccountState.NEEDS_ATTENTION, None, account.reason)
    if account.cooldown_until is not None and account.cooldown_until > now:
        return StateView(AccountState.COOLDOWN, account.cooldown_until, account.reason)
    return StateView(AccountState.OK, None, None)


# -- usage-cap reset times ---------------------------------------------------------
_UNIT_S = {
    "s": 1,
    "sec": 1,
    "second": 1,
    "m": 60,
    "min": 60,
    "minute": 60,
    "h": 3600,
    "hr": 3600,
    "hour": 3600,
    "d": 86400,
    "day": 86400,
}
_IN = re.compile(
    r"\bin\s+(?:about\s+)?(\d+(?:\.\d+)?|an?|one)\s*"
    r"(seconds?|secs?|s|minutes?|mins?|m|hours?|hrs?|h|days?|d)\b",
    re.IGNORECASE,
)
_CLOCK = re.compile(
    r"\b(?:after|at|until|by)\s+(\d{1,2})(?::(\d{2}))?\s*([ap]\.?m\.?)?\s*(utc|gmt|z)?\b",
    re.IGNORECASE,
)
_TOMORROW = re.compile(r"\btomorrow\b", re.IGNORECASE)


def parse_reset(text: str, now: float) -> float | None:
    """The epoch second a usage cap lifts, read from what a site says, or None.

    Forms: "in 3 hours", "in 45 minutes", "after 2:14 PM", "at 14:00 UTC",
    "tomorrow". Clock times are read as UTC (a headless server's pages show
    its own zone, which we run in UTC) and always lie in the future: a time
    already past today means tomorrow.
    """
    match = _IN.search(text)
    if match:
        amount_text, unit = match.group(1).lower(), match.group(2).lower()
        amount = 1.0 if amount_text in ("a", "an", "one") else float(amount_text)
        unit = unit.rstrip("s") if len(unit) > 1 else unit
        return now + amount * _UNIT_S[unit]
    today = datetime.fromtimestamp(now, UTC)
    match = _CLOCK.search(text)
    if match:
        hour, minute = int(match.group(1)), int(match.group(2) or 0)
        meridiem = (match.group(3) or "").replace(".", "").lower()
        if (meridiem and not 1 <= hour <= 12) or hour > 23 or minute > 59:
            return None
        if meridiem == "pm" and hour != 12:
            hour += 12
        elif meridiem == "am" and hour == 12:
            hour = 0
        if not meridiem and match.group(2) is None and match.group(4) is None:
            return None  # "at 3" alone is too vague to trust
        at = today.replace(hour=hour, minute=minute, second=0, microsecond=0)
        if at.timestamp() <= now:
            at += timedelta(days=1)
        if _TOMORROW.search(text) and at.date() == today.date():
            at += timedelta(days=1)
        return at.timestamp()
    if _TOMORROW.search(text):
        midnight = today.replace(hour=0, minute=0, second=0, microsecond=0)
        return (midnight + timedelta(days=1)).timestamp()
    return None


def cooldown_until(text: str, now: float, default_s: float) -> float:
    """When a capped account opens again: the page's own word, else the default."""
    parsed = parse_reset(text, now)
    return parsed if parsed is not None and parsed > now else now + default_s


# -- failure streaks -----------------------------------------------------------------
@dataclass(frozen=True)
class Streak:
    kind: str
    count: int


@dataclass(frozen=True)
class StreakDecision:
    streak: Streak | None
    attention: str | None  # the reason, when the account must stop
    failures: int = 0  # in a row, counting this one


def after_outcome(streak: Streak | None, kind: str | None, threshold: int) -> StreakDecision:
    """Count failures of one class in a row; `kind` None is a success (or an
    outcome that says nothing about the account). At `threshold` the account
    needs attention, with that class as the reason, and the count starts over."""
    if kind is None:
        return StreakDecision(None, None)
    count = streak.count + 1 if streak is not None and streak.kind == kind else 1
    if count >= threshold:
        return StreakDecision(None, f"{count} {kind} failures in a row", count)
    return StreakDecision(Streak(kind, count), None, count)


# -- adaptive concurrency ------------------------------------------------------------
@dataclass(frozen=True)
class Throttle:
    """A lane's effective concurrency under 429 storms, inside its quota."""

    effective: int
    throttles: int = 0  # 429s without Retry-After in a row
    successes: int = 0  # successes in a row since the last change


def after_call(throttle: Throttle, quota: int, *, throttled: bool) -> Throttle:
    """Halve on a storm of 429s without Retry-After (never below 1); one slot
    back after `SUCCESSES_TO_GROW` successes in a row (never above the quota)."""
    if throttled:
        throttles = throttle.throttles + 1
        if throttles >= THROTTLES_TO_SHRINK:
            return Throttle(max(1, throttle.effective // 2), 0, 0)
        return Throttle(throttle.effective, throttles, 0)
    successes = throttle.successes + 1
    if throttle.effective < quota and successes >= SUCCESSES_TO_GROW:
        return Throttle(throttle.effective + 1, 0, 0)
    return Throttle(min(throttle.effective, quota), 0, successes)
