"""Web accounts' browsers started when their lanes open, before any task.

A lane's first task would otherwise pay for its browser's start (self-check,
launch, CDP connect) and its first page load: about a second, in series
with the account's generations. So each web account's browser is started,
in the background, when its lane opens on this host: at the service's
start (after any demo login), when an account is added at run time or its
lease comes to this host, and when it comes back into service (enabled
again, logged in again, its cooldown over). The start itself is the web
runner's (`webrunner/prewarm.py`); what is decided here is which accounts,
and what a login problem found then does to the account: exactly what a
task's page check would do (`AccountHealth.hold_account`), with no task
spent or held. A task claimed while a start is under way waits for the
account's lock, then finds the browser; had the start met a login problem
(and closed it), the task starts its own, meets the same problem and is
held on its attempt, as without a pre-start. The setting `browser_prewarm`
turns it off.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Iterable, Mapping
from typing import TYPE_CHECKING

from dispatcher.accounts.failures import AccountHealth
from dispatcher.accounts.health import AccountState
from dispatcher.accounts.switches import AccountBook
from dispatcher.errors import AccountHold, AuthError, RunError
from dispatcher.events import AccountChanged, Event
from dispatcher.models import Kind
from dispatcher.profiles import Profile, WebSpec
from dispatcher.scheduling.lanes import LaneSpec

if TYPE_CHECKING:
    from webrunner.runner import WebRunner

log = logging.getLogger("dispatcher.accounts.warmup")


def accounts_to_prewarm(
    opened: Iterable[str],
    *,
    states: Mapping[str, AccountState],
    busy: Collection[str],
    enabled: bool,
    keep_alive_s: float,
) -> list[str]:
    """Which of the accounts whose lanes just `opened` get a browser now.

    None when the setting is off, or when keep-alive is 0: the browser
    would be closed before any task came. Only accounts in service: a
    disabled one, one that needs attention (the operator will open its
    profile; Chromium allows one browser per profile) and one cooling down
    (a cap may last an hour; its browser starts when the cooldown ends)
    get none. Nor one already `busy` (a browser open, a task or a start
    under way): it has, or is about to have, its browser.
    """
    if not enabled or keep_alive_s <= 0:
        return []
    return sorted(a for a in set(opened) if states.get(a) is AccountState.OK and a not in busy)


def came_into_service(event: Event) -> str | None:
    """The web account an event puts back into service (enabled again, a
    login done, a cooldown over), if it does."""
    match event:
        case AccountChanged(name=name, kind=Kind.WEB, state=AccountState.OK, previous=before) if (
            before is not AccountState.OK
        ):
            return name
    return None


def prewarm_spec(models: Iterable[str], profiles: Mapping[str, Profile]) -> WebSpec | None:
    """The page to start an account's browser on: its first loaded web model's
    (the first by name, as `WebRunner.spec_for`); a task of another model
    loads its own page in the same tab."""
    for name in sorted(models):
        profile = profiles.get(name)
        if profile is not None and profile.web is not None:
            return profile.web
    return None


class BrowserPrewarm:
    """Starts web accounts' browsers as their lanes open; see the module docstring."""

    def __init__(
        self,
        *,
        web: WebRunner,
        accounts: AccountBook,
        health: AccountHealth,
        profiles: Mapping[str, Profile],
        enabled: bool,
    ) -> None:
        self._web = web
        self._accounts = accounts
        self._health = health
        self._profiles = profiles  # the live mapping (a reload swaps its contents)
        self.enabled = enabled
        # Web accounts with a lane on this host, and the models each serves.
        self._lanes: dict[str, tuple[str, ...]] = {}
        self._jobs: dict[str, asyncio.Task[None]] = {}
        self._closed = False

    @property
    def starting(self) -> set[str]:
        """The accounts whose browser start is under way."""
        return set(self._jobs)

    def lanes_changed(self, lanes: Mapping[str, LaneSpec]) -> None:
        """The lanes this host opens now (at start, after a change of them)."""
        current = {lane.owner: lane.models for lane in lanes.values() if lane.kind is Kind.WEB}
        opened = current.keys() - self._lanes.keys()
        self._lanes = current
        self._start(opened)

    def on_event(self, event: Event) -> None:
        """Event-bus listener: an account back in service gets its browser again."""
        name = came_into_service(event)
        if name is not None and name in self._lanes:
            self._start([name])

    def _start(self, opened: Iterable[str]) -> None:
        if self._closed:
            return
        keeper = self._web.keeper
        busy = {
            *self._jobs,
            *self._web.open_browsers(),
            *(a for a, lock in keeper.locks.items() if lock.locked()),
        }
        wanted = set(opened)
        states = {
            a.name: self._accounts.state(a.name).state
            for a in self._accounts.all()
            if a.name in wanted
        }
        chosen = accounts_to_prewarm(
            opened,
            states=states,
            busy=busy,
            enabled=self.enabled,
            keep_alive_s=keeper.keep_alive_s,
        )
        for account in chosen:
            self._jobs[account] = asyncio.create_task(
                self._prewarm(account, keeper.tasks_run(account)),
                name=f"start the browser of {account}",
            )

    def _wanted(self, account: str) -> bool:
        """Still wanted, just before the launch: its lane is here and it is in service."""
        return not self._closed and account in self._lanes and self._accounts.is_open(account)

    async def _prewarm(self, account: str, tasks_seen: int) -> None:
        from webrunner.prewarm import prestart_browser

        lane = f"web:{account}"
        spec = prewarm_spec(self._lanes.get(account, ()), self._profiles)
        if spec is None:
            self._jobs.pop(account, None)
            return

        async def hold(exc: AuthError | AccountHold) -> None:
            # What a task's page check would have met: the account's state
            # changes the same way, and no task was spent on it.
            log.warning("[%s] its page, before any task: %s", lane, exc, extra={"lane": lane})
            await self._health.hold_account(account, Kind.WEB, exc, spec.cooldown_s)

        try:
            await prestart_browser(
                self._web,
                account,
                spec,
                wanted=lambda: self._wanted(account),
                tasks_seen=tasks_seen,
                hold=hold,
            )
        except (RunError, TimeoutError) as exc:
            # Its first task starts one itself (and counts a failure there).
            log.warning(
                "[%s] starting its browser before any task failed: %s; its first task starts one",
                lane,
                exc,
                extra={"lane": lane},
            )
        except Exception:
            log.exception("[%s] starting its browser before any task failed", lane)
        finally:
            self._jobs.pop(account, None)

    async def aclose(self) -> None:
        """Stop the starts under way (each closes what it launched); start no more."""
        self._closed = True
        jobs = list(self._jobs.values())
        for job in jobs:
            job.cancel()
        await asyncio.gather(*jobs, return_exceptions=True)
