"""Daily budgets per API provider (issue 30): what a claim must prove, and what
the service says while a provider's budget is reached.

The limits come from `DISPATCHER_BUDGETS` ("acme=50, demo=12.5") and the
`[budget] daily_usd` of each profile (for each of its providers; the
variable wins). The check itself is the store's: a claim takes a task only
if its estimated cost keeps the provider's spend since 00:00 UTC within the
limit, in the same atomic step (across hosts on PostgreSQL). What this book
keeps is only what to *say*: which provider has reached its budget, until when.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from dispatcher.events import BudgetReached, EventBus
from dispatcher.models import Task
from dispatcher.pricing import Budget, budget_reason, day_start, fits_budget, next_day_start
from dispatcher.profiles import Profile
from dispatcher.scheduling.lanes import LaneSpec
from dispatcher.store import Store

log = logging.getLogger("dispatcher.scheduling.budgets")


def budget_limits(profiles: Iterable[Profile], configured: Mapping[str, float]) -> dict[str, float]:
    """Provider -> dollars per day: the profiles' `[budget]`, then the setting over them."""
    limits: dict[str, float] = {}
    for profile in profiles:
        if profile.budget is None:
            continue
        for provider in profile.provider_names:
            # Two profiles of one provider stating different budgets: the stricter holds.
            limits[provider] = min(
                limits.get(provider, profile.budget.daily_usd), profile.budget.daily_usd
            )
    limits.update(configured)
    return limits


@dataclass(frozen=True)
class Reached:
    spent_usd: float
    limit_usd: float
    until: float  # 00:00 UTC of the next day

    def reason(self, provider: str) -> str:
        return budget_reason(provider, self.spent_usd, self.limit_usd)


class BudgetBook:
    """The providers' daily limits and which are reached (for answers, not for the check)."""

    def __init__(
        self,
        limits: Mapping[str, float],
        store: Store,
        events: EventBus | None = None,
    ) -> None:
        self.limits = dict(limits)
        self._store = store
        self._spent = store.spent_since
        self._reached: dict[str, Reached] = {}
        # Said once per provider and day by this host (log, SSE); the webhook
        # once across hosts (the store names the host that tells it).
        self._events = events

    def guard(self, owner: str, now: float) -> Budget | None:
        limit = self.limits.get(owner)
        return None if limit is None else Budget(owner, limit, day_start(now))

    async def after_claim(self, lane: LaneSpec, task: Task | None, now: float) -> None:
        """What a claim under the lane owner's budget tells: a task taken, the
        budget is not reached; none, perhaps it is (`nothing_claimed`)."""
        if task is not None:
            self._reached.pop(lane.owner, None)
            return
        await self.nothing_claimed(
            lane.owner, now, await self._store.cheapest_ready(lane.queues, now)
        )

    async def nothing_claimed(self, owner: str, now: float, cheapest_usd: float | None) -> None:
        """A claim under the budget took nothing: the budget is what stops the
        ready tasks when the day's spend leaves no room for the cheapest one."""
        limit = self.limits.get(owner)
        if limit is None:
            return
        if cheapest_usd is None:
            self._reached.pop(owner, None)
            return
        spent = await self._spent(owner, day_start(now))
        if fits_budget(spent_usd=spent, cost_usd=cheapest_usd, limit_usd=limit):
            self._reached.pop(owner, None)  # something else held it (a quota, a lease)
            return
        known = self._reached.get(owner)
        reached = Reached(round(spent, 6), limit, next_day_start(now))
        self._reached[owner] = reached
        if known is None or known.until != reached.until:
            log.warning("%s: budget reached until 00:00 UTC", reached.reason(owner))
            if self._events is not None:
                self._events.publish(
                    BudgetReached(
                        owner, reached.spent_usd, limit, reached.until, reached.reason(owner)
                    )
                )

    def reached(self, owner: str, now: float) -> Reached | None:
        found = self._reached.get(owner)
        if found is not None and now >= found.until:
            # A new day: the budget is whole again.
            del self._reached[owner]
            return None
        return found

    async def view(self, owner: str, now: float) -> dict[str, object] | None:
        """The provider's budget for a lanes answer; None when it has none."""
        limit = self.limits.get(owner)
        if limit is None:
            return None
        reached = self.reached(owner, now)
        return {
            "daily_usd": limit,
            "spent_usd": round(await self._spent(owner, day_start(now)), 6),
            "reached": reached is not None,
            "until": reached.until if reached is not None else None,
        }
