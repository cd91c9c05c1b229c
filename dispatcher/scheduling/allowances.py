"""Web accounts' daily allowances (issue 30): an account that has used its
generations for the day is given no task until its reset.

A web profile's `[web] daily_limit` (generations per account per day) and
`daily_reset` ("HH:MM" UTC, default "00:00") state it; an account serving
several such models holds the strictest. The count comes from the store
(`Store.generations_since`: the attempts the account started since its last
reset, the one running included; an attempt put back without being charged,
such as a usage cap met or a login wall, is not counted), so it survives a
restart and holds across hosts. It is checked where the account's lane
claims: one generation per account at a time, and across hosts an account is
leased to one host, so the count and the claim that follows are serial per
account. A cap the site shows anyway still cools the account down (the
existing rule, `accounts.failures`).

The rules are pure functions; `AllowanceBook` reads the count and keeps what
to say (which account has used its allowance, until when).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from dispatcher.models import Kind
from dispatcher.profiles import Profile

log = logging.getLogger("dispatcher.scheduling.allowances")


def last_reset(now: float, reset_minute: int) -> float:
    """The latest reset at or before `now`: the allowance's day began then."""
    moment = datetime.fromtimestamp(now, UTC)
    at = moment.replace(hour=reset_minute // 60, minute=reset_minute % 60, second=0, microsecond=0)
    if at > moment:
        at -= timedelta(days=1)
    return at.timestamp()


def next_reset(now: float, reset_minute: int) -> float:
    start = datetime.fromtimestamp(last_reset(now, reset_minute), UTC)
    return (start + timedelta(days=1)).timestamp()


def clock_text(reset_minute: int) -> str:
    return f"{reset_minute // 60:02d}:{reset_minute % 60:02d} UTC"


@dataclass(frozen=True)
class Allowance:
    """One account's generations per day and when its day begins."""

    limit: int
    reset_minute: int = 0  # minutes after 00:00 UTC


@dataclass(frozen=True)
class AllowanceUsed:
    """An account that has used its allowance: no task until `until`."""

    used: int
    limit: int
    until: float  # epoch seconds of the next reset
    reset_minute: int

    def reason(self) -> str:
        return f"allowance used, {self.used} of {self.limit}, until {clock_text(self.reset_minute)}"


def allowances(profiles: Iterable[Profile]) -> dict[str, Allowance]:
    """Account -> its allowance, from the web profiles that state one; an
    account serving several limited models holds the strictest (the site
    counts the account's generations, whatever the model)."""
    found: dict[str, Allowance] = {}
    for profile in profiles:
        web = profile.web
        if profile.kind is not Kind.WEB or web is None or web.daily_limit is None:
            continue
        allowance = Allowance(web.daily_limit, web.reset_minute)
        for account in profile.accounts:
            known = found.get(account)
            if known is None or allowance.limit < known.limit:
                found[account] = allowance
    return found


def allowance_check(allowance: Allowance, used: int, now: float) -> AllowanceUsed | None:
    """None while the account may start one more generation today."""
    if used < allowance.limit:
        return None
    return AllowanceUsed(
        used, allowance.limit, next_reset(now, allowance.reset_minute), allowance.reset_minute
    )


# The store's count of an account's charged attempts since an instant.
CountSince = Callable[[str, float], Awaitable[int]]


class AllowanceBook:
    """The accounts' allowances, the check before a claim, and what to say."""

    def __init__(self, limits: Mapping[str, Allowance], count: CountSince) -> None:
        self.limits = dict(limits)
        self._count = count
        self._used: dict[str, AllowanceUsed] = {}

    def replace(self, limits: Mapping[str, Allowance]) -> None:
        """New profiles (a reload): what was said is checked again at the next claim."""
        self.limits = dict(limits)
        self._used.clear()

    async def used_up(self, owner: str, now: float) -> AllowanceUsed | None:
        """Checked before the account's lane claims: None while it may take a task."""
        allowance = self.limits.get(owner)
        if allowance is None:
            return None
        known = self._used.get(owner)
        if known is not None and now < known.until:
            return known  # the count only grows until the reset
        used = await self._count(owner, last_reset(now, allowance.reset_minute))
        found = allowance_check(allowance, used, now)
        if found is None:
            self._used.pop(owner, None)
        elif known is None or known.until != found.until:
            self._used[owner] = found
            log.warning("[web:%s] %s", owner, found.reason(), extra={"lane": f"web:{owner}"})
        return found

    def said(self, owner: str, now: float) -> AllowanceUsed | None:
        """What the last check found, while it holds (answers, not the check)."""
        found = self._used.get(owner)
        if found is not None and now >= found.until:
            del self._used[owner]
            return None
        return found

    def next_opening(self) -> float | None:
        """The earliest reset of a used-up account: the scheduler wakes then."""
        return min((used.until for used in self._used.values()), default=None)

    async def view(self, owner: str, now: float) -> dict[str, object] | None:
        """The account's allowance for a lanes answer; None when it has none."""
        allowance = self.limits.get(owner)
        if allowance is None:
            return None
        used_up = self.said(owner, now)
        used = (
            used_up.used
            if used_up is not None
            else await self._count(owner, last_reset(now, allowance.reset_minute))
        )
        return {
            "daily_limit": allowance.limit,
            "used": used,
            "resets_at": clock_text(allowance.reset_minute),
            "reached": used_up is not None,
            "until": used_up.until if used_up is not None else None,
            "reason": used_up.reason() if used_up is not None else None,
        }
