"""Web accounts added and removed while serving, persisted in the store.

A profile's `accounts = [...]` list is always there; the store adds more
(`dispatcher accounts add`). Adding locks the account's browser profile,
makes its user-data dir and opens its lane at once; removing closes the
lane to new tasks, and once its running task ends, closes its browser and
releases its lock.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from dispatcher.accounts.switches import AccountBook
from dispatcher.clock import Clock
from dispatcher.errors import InputError, LockHeld, NotFound, StateConflict
from dispatcher.models import JSON, Kind
from dispatcher.profiles import Profile
from dispatcher.scheduling.scheduler import Scheduler
from dispatcher.store import Store
from dispatcher.store.hosts import LeaseRefused

if TYPE_CHECKING:
    from webrunner.runner import WebRunner

log = logging.getLogger("dispatcher.accounts.switches")

MAX_MODELS = 100


class Roster:
    def __init__(
        self,
        *,
        store: Store,
        clock: Clock,
        accounts: AccountBook,
        scheduler: Scheduler,
        profiles: Mapping[str, Profile],
        web: WebRunner | None,
        relane: Callable[[], Awaitable[None]],
        held_elsewhere: Callable[[str], Awaitable[LeaseRefused | None]] | None = None,
    ) -> None:
        self._store = store
        self._clock = clock
        self._accounts = accounts
        self._scheduler = scheduler
        self._profiles = profiles  # the live mapping (a reload swaps its contents)
        self._web = web
        self._relane = relane
        self._held_elsewhere = held_elsewhere
        self._draining: dict[str, asyncio.Task[None]] = {}
        # One add or remove at a time: each reads the store, then takes or
        # gives up the account's lock and row across awaits (a removal waits
        # for its browser's graceful close); interleaved, an add answered
        # during a removal had its lock and row taken away by the removal's end.
        # A reload takes it too: a profile it loads may list such an account.
        self.changing = asyncio.Lock()

    def _from_profiles(self, name: str) -> list[str]:
        return sorted(p.source or p.name for p in self._profiles.values() if name in p.accounts)

    async def add(self, name: str, models: Sequence[str]) -> JSON:
        """Add a web account serving `models` (web models loaded now); it serves at once."""
        from webrunner.profiledirs import check_account_name

        check_account_name(name)
        web_models = sorted(n for n, p in self._profiles.items() if p.kind is Kind.WEB)
        if not models or len(models) > MAX_MODELS:
            raise InputError(f"give 1..{MAX_MODELS} web models; loaded: {', '.join(web_models)}")
        unknown = sorted(set(models) - set(web_models))
        if unknown:
            raise InputError(
                f"not a loaded web model: {', '.join(unknown)}; "
                f"web models: {', '.join(web_models) or 'none'}"
            )
        if self._web is None:
            raise InputError("no web runner in this run (no web model was loaded at start)")
        existing = self._accounts.all()
        if any(a.name == name and a.kind is Kind.API for a in existing):
            raise StateConflict(f"{name!r} is an API provider, not a web account")
        async with self.changing:
            return await self._add(self._web, name, models)

    async def _add(self, web: WebRunner, name: str, models: Sequence[str]) -> JSON:
        if name in self._draining:
            raise StateConflict(f"web account {name!r} is being removed; add it once it is gone")
        if self._held_elsewhere is not None:
            # Added here, it would only be listed as refused: say so instead of "added".
            holder = await self._held_elsewhere(name)
            if holder is not None:
                raise StateConflict(
                    f"web account {name!r} is served by host {holder.holder!r}; "
                    "remove it there (or stop that host) before adding it here"
                )
        stored = (await self._store.get_web_accounts()).get(name, ())
        try:
            web.add_owner(name)
        except LockHeld as exc:
            raise StateConflict(str(exc)) from exc
        serves = sorted({*stored, *models})
        await self._store.put_web_account(name, serves, self._clock.now())
        await self._relane()
        log.info(
            "[web:%s] added, serving %s", name, ", ".join(serves), extra={"lane": f"web:{name}"}
        )
        return {"name": name, "models": serves, "profiles": self._from_profiles(name)}

    async def remove(self, name: str, *, drain: bool) -> JSON:
        """Remove an added web account; refused while it runs a task unless `drain`,
        and while an operator's login session has its profile open."""
        async with self.changing:
            return await self._remove(name, drain=drain)

    async def _remove(self, name: str, *, drain: bool) -> JSON:
        listed = self._from_profiles(name)
        if listed:
            raise StateConflict(
                f"web account {name!r} is listed in {', '.join(listed)}; remove it there and reload"
            )
        if name not in await self._store.get_web_accounts():
            raise NotFound(f"no web account {name!r} was added at run time")
        if self._web is not None and self._web.logins.is_open(name):
            # The session holds the profile until it ends (up to its idle
            # limit): the removal would wait behind it, half done.
            raise StateConflict(
                f"web account {name!r} has a login session open; "
                "finish or cancel it, then remove the account"
            )
        lane = f"web:{name}"
        running = self._scheduler.lane_tasks(lane)
        if running and not drain:
            raise StateConflict(
                f"web account {name!r} is running task {', '.join(running)}; wait for it, "
                "or remove it with drain (it takes no new task and goes when that one ends)"
            )
        await self._store.delete_web_account(name)
        await self._relane()  # no new task from here on
        if running:
            job = asyncio.create_task(self._release_when_idle(name, lane), name=f"drain {name}")
            self._draining[name] = job
            log.info(
                "[web:%s] draining: removed once task %s ends",
                name,
                ", ".join(running),
                extra={"lane": lane},
            )
            return {"name": name, "removed": False, "draining": True, "running": running}
        await self._release(name)
        return {"name": name, "removed": True, "draining": False, "running": []}

    async def _release_when_idle(self, name: str, lane: str) -> None:
        try:
            await self._scheduler.wait_lane_idle(lane)
            async with self.changing:
                await self._release(name)
                await self._relane()  # its lease can go now that its task has ended
        finally:
            self._draining.pop(name, None)

    async def _release(self, name: str) -> None:
        listed = self._from_profiles(name)
        if listed:
            # A reload listed it while it drained (the account moved into a
            # profile): that profile's lane serves it, on this lock and row.
            log.info(
                "[web:%s] kept: listed in %s now",
                name,
                ", ".join(listed),
                extra={"lane": f"web:{name}"},
            )
            return
        if self._web is not None:
            await self._web.remove_account(name)
        await self._accounts.forget(name)

    async def aclose(self) -> None:
        for job in list(self._draining.values()):
            job.cancel()
        await asyncio.gather(*self._draining.values(), return_exceptions=True)
