"""The operator's switches: web accounts and API providers, on or off, persisted."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass

from dispatcher.accounts.health import AccountState, StateView, state_of
from dispatcher.clock import Clock
from dispatcher.errors import InputError, NotFound
from dispatcher.events import AccountChanged, EventBus
from dispatcher.logs import mask_secrets
from dispatcher.models import JSON, Account, Kind
from dispatcher.store import Store
from dispatcher.strictjson import storable_text

log = logging.getLogger("dispatcher.accounts.switches")

MAX_REASON_CHARS = 500
# Nominal seconds an unreachable provider gets no new task; then one tries it
# again (a running task's polls clear the outage as soon as one answers).
UNREACHABLE_PROBE_S = 30.0


@dataclass
class Outage:
    """A provider's server refusing connections: since when, and when a
    lane may try it again (epoch seconds)."""

    since: float
    probe_at: float
    reason: str


def utc_time(epoch_s: float) -> str:
    return time.strftime("%H:%M:%S UTC", time.gmtime(epoch_s))


class AccountBook:
    """In-memory view of the accounts table; every change is written through."""

    def __init__(
        self, store: Store, clock: Clock, events: EventBus, accounts: dict[str, Account]
    ) -> None:
        self._store = store
        self._clock = clock
        self._events = events
        self._accounts = accounts
        # Providers that cannot be reached now: memory only, never stored
        # (a restart simply tries them again).
        self._outages: dict[str, Outage] = {}
        # The state each account was last announced in: a cooldown ends by
        # itself, and that change is announced by `refresh`.
        self._announced = {name: self._state_of(a).state for name, a in self._accounts.items()}
        # A write takes a round trip on PostgreSQL: a change and a removal
        # (`forget`) in flight together brought the removed row back.
        self._writing = asyncio.Lock()

    @classmethod
    async def load(cls, store: Store, clock: Clock, events: EventBus) -> AccountBook:
        """The book as the store holds it now."""
        return cls(store, clock, events, await store.get_accounts())

    def _state_of(self, account: Account) -> StateView:
        view = state_of(account, self._clock.now())
        outage = self._outages.get(account.name)
        if outage is None or view.state is not AccountState.OK:
            return view  # the operator's switch and a cap outrank an outage
        reason = f"unreachable since {utc_time(outage.since)}: {outage.reason}"
        return StateView(AccountState.UNREACHABLE, outage.probe_at, reason, outage.since)

    # -- outages (in memory) --------------------------------------------------
    def mark_unreachable(self, name: str, reason: str, probe_in_s: float) -> None:
        """The provider refused a connection: no new task goes to it until
        `probe_in_s` (real seconds) has passed; then one may try again."""
        account = self._accounts.get(name)
        if account is None:
            return
        now = self._clock.now()
        outage = self._outages.get(name)
        reason = storable_text(mask_secrets(reason))[:MAX_REASON_CHARS]
        if outage is None:
            self._outages[name] = Outage(now, now + probe_in_s, reason)
            self._announce(account, "unreachable")
        else:
            outage.probe_at, outage.reason = now + probe_in_s, reason

    def mark_reachable(self, name: str) -> None:
        """The provider answered: the outage is over."""
        if self._outages.pop(name, None) is not None and name in self._accounts:
            self._announce(self._accounts[name], "reachable again")

    def unreachable_since(self, name: str) -> float | None:
        outage = self._outages.get(name)
        return outage.since if outage is not None else None

    async def ensure(self, names: Iterable[tuple[str, Kind]]) -> None:
        """Every lane has a row; existing rows keep the operator's last word."""
        for name, kind in names:
            if name not in self._accounts:
                account = Account(name=name, kind=kind, updated_at=self._clock.now())
                await self._store.upsert_account(account)
                self._accounts[name] = account
                self._announced[name] = self._state_of(account).state

    async def forget(self, name: str) -> None:
        """A web account removed at run time: its switches go with it."""
        async with self._writing:
            if self._accounts.pop(name, None) is None:
                return
            await self._store.delete_account(name)
            log.info("[web:%s] removed", name, extra={"lane": f"web:{name}"})

    def all(self) -> list[Account]:
        return sorted(self._accounts.values(), key=lambda a: (a.kind.value, a.name))

    def get(self, name: str) -> Account:
        account = self._accounts.get(name)
        if account is None:
            known = ", ".join(sorted(self._accounts)) or "none"
            raise NotFound(f"no account or provider {name!r}; known: {known}")
        return account

    def state(self, name: str) -> StateView:
        return self._state_of(self.get(name))

    def is_open(self, name: str) -> bool:
        """Whether the lane may start new tasks (a cooldown opens by itself;
        an unreachable provider gets one try again once its probe time came)."""
        account = self._accounts.get(name)
        if account is None:
            return False
        view = self._state_of(account)
        if view.state is AccountState.UNREACHABLE:
            return view.until is not None and self._clock.now() >= view.until
        return view.open

    def next_opening(self) -> float | None:
        """The earliest epoch second a cooling-down account opens: the scheduler wakes then."""
        now = self._clock.now()
        ends = [
            a.cooldown_until
            for a in self._accounts.values()
            if state_of(a, now).state is AccountState.COOLDOWN and a.cooldown_until is not None
        ]
        ends += [o.probe_at for o in self._outages.values() if o.probe_at > now]
        return min(ends, default=None)

    def view(self, account: Account) -> JSON:
        """What `GET /v1/accounts` and the SSE event answer: the record plus its state."""
        state = self._state_of(account)
        return {
            **account.to_json(),
            "state": state.state.value,
            "until": state.until,
            "reason": state.reason,
            "since": state.since,
        }

    def views(self) -> list[JSON]:
        return [self.view(a) for a in self.all()]

    async def refresh(self) -> None:
        """Announce the states time changed (a cooldown that ended by itself)."""
        for account in list(self._accounts.values()):
            if self._accounts.get(account.name) is not account:
                continue  # removed while an earlier one was written
            state = self._state_of(account)
            if state.state is AccountState.OK and account.cooldown_until is not None:
                # The cap has lifted: its reason no longer describes the account.
                account.cooldown_until = None
                account.reason = None
                with contextlib.suppress(NotFound):  # removed as it is written
                    await self._save(account, "cooldown ended")
            elif state.state != self._announced.get(account.name):
                self._announce(account, "state changed")

    async def _save(self, account: Account, what: str) -> Account:
        async with self._writing:
            if self._accounts.get(account.name) is not account:
                # Removed since the caller looked it up (a login finishing
                # as `accounts remove` lands): the row stays gone.
                raise NotFound(f"account {account.name!r} was removed meanwhile")
            account.updated_at = self._clock.now()
            await self._store.upsert_account(account)
            self._announce(account, what)
        return account

    def _announce(self, account: Account, what: str) -> None:
        before = self._announced.get(account.name)
        after = self._state_of(account)
        self._announced[account.name] = after.state
        prefix = "web" if account.kind is Kind.WEB else "api"
        log.info(
            "[%s:%s] %s: state %s%s%s",
            prefix,
            account.name,
            what,
            after.state.value,
            f" until {after.until:.0f}" if after.until is not None else "",
            f" (reason: {account.reason})" if account.reason else "",
            extra={"lane": f"{prefix}:{account.name}"},
        )
        self._events.publish(
            AccountChanged(
                name=account.name,
                kind=account.kind,
                state=after.state,
                previous=before,
                view=self.view(account),
            )
        )

    async def disable(self, name: str, reason: str) -> Account:
        reason = reason.strip()
        if not reason:
            raise InputError("disabling needs a reason (who reads the dashboard will ask why)")
        if len(reason) > MAX_REASON_CHARS:
            raise InputError(f"reason is longer than {MAX_REASON_CHARS} characters")
        account = self.get(name)
        account.enabled = False
        account.reason = reason
        return await self._save(account, "disabled")

    async def enable(self, name: str) -> Account:
        account = self.get(name)
        account.enabled = True
        account.needs_attention = False
        account.cooldown_until = None  # the operator's word outranks a cap's guess
        account.reason = None
        return await self._save(account, "enabled")

    async def needs_attention(self, name: str, reason: str) -> Account:
        account = self.get(name)
        account.needs_attention = True
        # A vendor's 401 may echo the key (or hold a NUL, which PostgreSQL
        # refuses): reasons are stored and sent out.
        account.reason = storable_text(mask_secrets(reason))[:MAX_REASON_CHARS]
        return await self._save(account, "needs attention")

    async def cool_down(self, name: str, until: float, reason: str) -> Account:
        """A usage cap: closed until `until` (epoch seconds), then open by itself."""
        account = self.get(name)
        account.cooldown_until = until
        account.reason = storable_text(mask_secrets(reason))[:MAX_REASON_CHARS]
        return await self._save(account, "cooling down")
