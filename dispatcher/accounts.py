"""The operator's switches: web accounts and API providers, on or off, persisted."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from dispatcher.clock import Clock
from dispatcher.errors import InputError, NotFound
from dispatcher.events import EventBus
from dispatcher.models import Account, Kind
from dispatcher.store import Store

log = logging.getLogger("dispatcher.accounts")

MAX_REASON_CHARS = 500


class AccountBook:
    """In-memory view of the accounts table; every change is written through."""

    def __init__(self, store: Store, clock: Clock, events: EventBus) -> None:
        self._store = store
        self._clock = clock
        self._events = events
        self._accounts = store.get_accounts()

    def ensure(self, names: Iterable[tuple[str, Kind]]) -> None:
        """Every lane has a row; existing rows keep the operator's last word."""
        for name, kind in names:
            if name not in self._accounts:
                account = Account(name=name, kind=kind, updated_at=self._clock.now())
                self._store.upsert_account(account)
                self._accounts[name] = account

    def forget(self, name: str) -> None:
        """A web account removed at run time: its switches go with it."""
        if self._accounts.pop(name, None) is not None:
            self._store.delete_account(name)
            log.info("[web:%s] removed", name)

    def all(self) -> list[Account]:
        return sorted(self._accounts.values(), key=lambda a: (a.kind.value, a.name))

    def get(self, name: str) -> Account:
        account = self._accounts.get(name)
        if account is None:
            known = ", ".join(sorted(self._accounts)) or "none"
            raise NotFound(f"no account or provider {name!r}; known: {known}")
        return account

    def is_open(self, name: str) -> bool:
        """Whether the lane may start new tasks."""
        account = self._accounts.get(name)
        return account is not None and account.enabled and not account.needs_attention

    def _save(self, account: Account, what: str) -> Account:
        account.updated_at = self._clock.now()
        self._store.upsert_account(account)
        self._accounts[account.name] = account
        prefix = "web" if account.kind is Kind.WEB else "api"
        log.info(
            "[%s:%s] %s%s",
            prefix,
            account.name,
            what,
            f" (reason: {account.reason})" if account.reason else "",
        )
        self._events.publish({"type": "account", "account": account.to_json()})
        return account

    def disable(self, name: str, reason: str) -> Account:
        reason = reason.strip()
        if not reason:
            raise InputError("disabling needs a reason (who reads the dashboard will ask why)")
        if len(reason) > MAX_REASON_CHARS:
            raise InputError(f"reason is longer than {MAX_REASON_CHARS} characters")
        account = self.get(name)
        account.enabled = False
        account.reason = reason
        return self._save(account, "disabled")

    def enable(self, name: str) -> Account:
        account = self.get(name)
        account.enabled = True
        account.needs_attention = False
        account.reason = None
        return self._save(account, "enabled")

    def needs_attention(self, name: str, reason: str) -> Account:
        account = self.get(name)
        account.needs_attention = True
        account.reason = reason
        return self._save(account, "needs attention")
