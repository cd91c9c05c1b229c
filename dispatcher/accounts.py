"""The operator's switches: web accounts and API providers, on or off, persisted."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable

from dispatcher.clock import Clock
from dispatcher.errors import InputError, NotFound
from dispatcher.events import AccountChanged, EventBus
from dispatcher.health import AccountState, StateView, state_of
from dispatcher.logs import mask_secrets
from dispatcher.models import JSON, Account, Kind
from dispatcher.store import Store
from dispatcher.strictjson import storable_text

log = logging.getLogger("dispatcher.accounts")

MAX_REASON_CHARS = 500


class AccountBook:
    """In-memory view of the accounts table; every change is written through."""

    def __init__(
        self, store: Store, clock: Clock, events: EventBus, accounts: dict[str, Account]
    ) -> None:
        self._store = store
        self._clock = clock
        self._events = events
        self._accounts = accounts
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
        return state_of(account, self._clock.now())

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
        return state_of(self.get(name), self._clock.now())

    def is_open(self, name: str) -> bool:
        """Whether the lane may start new tasks (a cooldown opens by itself)."""
        account = self._accounts.get(name)
        return account is not None and state_of(account, self._clock.now()).open

    def next_opening(self) -> float | None:
        """The earliest epoch second a cooling-down account opens: the scheduler wakes then."""
        now = self._clock.now()
        ends = [
            a.cooldown_until
            for a in self._accounts.values()
            if state_of(a, now).state is AccountState.COOLDOWN and a.cooldown_until is not None
        ]
        return min(ends, default=None)

    def view(self, account: Account) -> JSON:
        """What `GET /v1/accounts` and the SSE event answer: the record plus its state."""
        state = state_of(account, self._clock.now())
        return {
            **account.to_json(),
            "state": state.state.value,
            "until": state.until,
            "reason": state.reason,
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
