"""How a failed run changes its account: a hold, or one more failure in a row.

An account-level failure (a usage limit, a login wall, a refused key) puts
the task back on the same attempt and changes the account's state at once;
other failures of one class in a row take the account out of service once
they reach the threshold (`dispatcher.accounts.health.after_outcome` decides).
"""

from __future__ import annotations

from dispatcher.accounts.health import (
    DEFAULT_COOLDOWN_S,
    DEFAULT_FAILURES_FOR_ATTENTION,
    Streak,
    after_outcome,
)
from dispatcher.accounts.switches import MAX_REASON_CHARS, UNREACHABLE_PROBE_S, AccountBook
from dispatcher.clock import Clock
from dispatcher.errors import UNREACHABLE_KIND, AccountHold, AuthError, RunError
from dispatcher.models import Kind
from dispatcher.scheduling.running import Running
from dispatcher.tasks.ledger import Ledger

# Failures of one class in a row on one account before it is taken out of
# service (`dispatcher.accounts.health.after_outcome`): one can be a hiccup (a busy
# machine, a port taken); three, each after its retry delay, mean the account
# or its browser is broken (a bad executable, a banned account, a full disk),
# and a lane that kept trying would spend every task's attempts on it.
# The setting `account_failures_for_attention` overrides it.
BROWSER_START_KIND = "browser_start"  # the kind of the web runner's launch failures
# Error kinds that name the task, not the account: they never count.
_TASK_FAULTS = frozenset({"canceled", "template", "refused", "disk_full", "stale", "url_refused"})


class AccountHealth:
    """The scheduler's reactions to a run's failure, per lane owner."""

    def __init__(
        self,
        ledger: Ledger,
        clock: Clock,
        accounts: AccountBook,
        failures_for_attention: int = DEFAULT_FAILURES_FOR_ATTENTION,
    ) -> None:
        self.ledger = ledger
        self.clock = clock
        self.accounts = accounts
        self.failures_for_attention = failures_for_attention
        self._streaks: dict[str, Streak] = {}  # owner -> failures of one class in a row

    def succeeded(self, owner: str) -> None:
        self._streaks.pop(owner, None)

    async def hold(self, running: Running, error: RunError, durations: dict[str, float]) -> bool:
        """The account, not the task, failed: the task goes back to pending on
        the same attempt (another account of its model may take it) and the
        account changes state. True when that is what happened."""
        web = running.ctx.profile.web
        cooldown_s = web.cooldown_s if web is not None else DEFAULT_COOLDOWN_S
        if not await self.hold_account(running.lane.owner, running.lane.kind, error, cooldown_s):
            return False
        stored = await self.ledger.current(running.task.id)
        if stored is not None and stored.cancel_requested:
            # Asked to cancel while it ran: that outcome wins over waiting.
            await self.ledger.mark_canceled(running.task, durations)
        else:
            await self.ledger.requeue(running.task, f"held: {error.kind} on {running.lane.name}")
        return True

    async def hold_account(
        self, owner: str, kind: Kind, error: RunError, cooldown_s: float
    ) -> bool:
        """Change the account's state for an account-level failure (a usage
        cap: cooldown, until the page's reset time or for `cooldown_s`
        nominal seconds; a login wall or a human check: needs attention),
        whether a task's run met it or its browser's start before any task
        (`dispatcher.accounts.warmup`). False when `error` is not one of those."""
        if isinstance(error, AccountHold) and error.kind == UNREACHABLE_KIND:
            # Its server refuses connections: skipped until a probe, with no
            # attempt spent (another provider of the model may take the task).
            probe_s = self.clock.scaled(UNREACHABLE_PROBE_S)
            self.accounts.mark_unreachable(owner, str(error), probe_s)
        elif isinstance(error, AccountHold) and error.kind == "usage_limit":
            until = error.until
            if until is None:
                until = self.clock.now() + self.clock.scaled(cooldown_s)
            await self.accounts.cool_down(owner, until, f"usage limit: {error}")
        elif isinstance(error, AccountHold):
            await self.accounts.needs_attention(owner, f"{error.kind}: {error}")
        elif isinstance(error, AuthError) and kind is Kind.WEB:
            await self.accounts.needs_attention(owner, f"logged out: {error}")
        elif kind is Kind.API and error.kind in ("http_401", "http_403"):
            await self.accounts.needs_attention(owner, f"the provider refused the key: {error}")
        elif kind is Kind.API and error.kind == "quota":  # a profile's `[api.errors] quota`
            await self.accounts.needs_attention(owner, f"the key's quota is spent: {error}")
        else:
            return False
        self._streaks.pop(owner, None)
        return True

    async def count_failure(self, owner: str, error: RunError) -> None:
        """N failures of one class in a row on one lane owner: it needs an operator."""
        kind = None if error.kind in _TASK_FAULTS else error.kind
        decision = after_outcome(self._streaks.get(owner), kind, self.failures_for_attention)
        if decision.streak is None:
            self._streaks.pop(owner, None)
        else:
            self._streaks[owner] = decision.streak
        if decision.attention is not None:
            what = (
                f"the browser failed to start {decision.failures} times in a row"
                if error.kind == BROWSER_START_KIND
                else decision.attention
            )
            reason = f"{what}; last: {error}"
            await self.accounts.needs_attention(owner, reason[:MAX_REASON_CHARS])
