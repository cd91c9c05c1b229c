"""Each web account's browser between tasks: kept open, pre-loaded, closed when idle.

Launching Chromium and connecting to it cost seconds, loading the model's
page a few hundred milliseconds more: both are paid on the account's lane,
in series with its generations. So after a task that succeeded the browser
stays open on a fresh copy of the model's page for the account's next task.
That copy is loaded in a spare tab while the task's generation runs (the
page is only loaded, nothing is typed into it: one generation at a time
still holds). The finished conversation's tab is kept, parked, and is the
spare tab of the task after next: loading a page again in a tab costs
Chromium about half of what a new tab costs (a new renderer, its
compositor; ~150 ms of CPU against ~300 on the 2-core VM), which twenty
accounts on two cores pay per task. When the account's generations run
longer than a pre-loaded page stays fresh, the spare would be stale by
then, so the page is loaded again in the same tab after the answer
instead. What the keeper guarantees:

- an account has at most one browser, and the runner knows its PID;
- a browser started before the account's first task (`prewarm.py`) is
  kept the same way, on its checked page, the first spare loaded beside it
  (used if the first task comes while it can still be fresh at its end);
- a kept browser is closed after `keep_alive_s` without a task, when its
  account is taken out of service (disabled, or needs a new login: the
  operator will open the profile, and Chromium allows one browser per
  profile), and when the runner stops;
- everything that touches an account's browser holds the account's lock,
  so a closing browser is never handed to a task.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import subprocess
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from playwright.async_api import BrowserContext, Page
from playwright.async_api import Error as PlaywrightError

from dispatcher.accounts.health import AccountState
from dispatcher.background import stop_background
from dispatcher.events import AccountChanged, Event
from dispatcher.models import Kind
from webrunner.browser import BrowserSession, Log
from webrunner.guard import own_page

# Real seconds. A page pre-loaded longer ago than this is loaded again: a
# site's page may hold tokens that go stale while nobody looks at it.
# States in which an account takes no task: its kept browser is given back.
_OUT_OF_SERVICE = frozenset({AccountState.DISABLED, AccountState.NEEDS_ATTENTION})
PRELOAD_FRESH_S = 30.0
PRELOAD_TIMEOUT_S = 30.0
# The read after the load is a couple of round trips; a page that does not
# answer it within this keeps the next task waiting no longer than that.
PRIME_TIMEOUT_S = 5.0

Closer = Callable[[BrowserSession, Log], Awaitable[None]]
# After the page has loaded: a first read of it, so that Playwright's own
# scripts are in place in the new document before a task needs them (the
# first call into each of a document's worlds costs ~25-40 ms; see
# `looks.prime`). It must not change the page.
Primer = Callable[[Page], Awaitable[None]]


class Watcher(Protocol):
    """Told when a browser is handed back (kept, idle) or gone (`memorygate.py`)."""

    def settled(self, account: str) -> None: ...

    def gone(self, account: str) -> None: ...


@dataclass
class _Preload:
    url: str
    # -> (the tab, when its page had loaded: None if the load failed)
    task: asyncio.Task[tuple[Page | None, float | None]]


@dataclass(frozen=True)
class Preloaded:
    """The tab the next task types into, and whether its page is loaded and fresh."""

    page: Page
    fresh: bool


async def load_copy(page: Page, url: str, prime: Primer | None) -> float | None:
    """Load `url` in `page` (then `prime` it): when it had loaded
    (monotonic), None if it did not."""
    try:
        await page.goto(url, wait_until="domcontentloaded", timeout=PRELOAD_TIMEOUT_S * 1000)
    except PlaywrightError:
        return None  # the next task loads it itself (or finds the browser dead)
    loaded_at = time.monotonic()
    if prime is not None:
        # Best effort: a page that does not answer here is the task's to judge.
        with contextlib.suppress(PlaywrightError, TimeoutError):
            async with asyncio.timeout(PRIME_TIMEOUT_S):
                await prime(page)
    return loaded_at


async def _load_in(page: Page, url: str, prime: Primer | None) -> tuple[Page | None, float | None]:
    return page, await load_copy(page, url, prime)


async def _load_spare(
    context: BrowserContext, parked: Page | None, url: str, prime: Primer | None
) -> tuple[Page | None, float | None]:
    """The next task's page: loaded again in the parked tab, else in a new one."""
    page = parked
    if page is None or page.is_closed():
        try:
            page = await own_page(context)
        except PlaywrightError:
            return None, None
    return page, await load_copy(page, url, prime)


async def _loaded(page: Page, loaded_at: float) -> tuple[Page | None, float | None]:
    return page, loaded_at


async def _close_tab(page: Page) -> None:
    with contextlib.suppress(PlaywrightError):
        await page.close()


async def _discard(spare: _Preload) -> None:
    """A spare tab not used after all: let its load end, then close it."""
    page, _ = await spare.task
    if page is not None:
        await _close_tab(page)


class BrowserKeeper:
    def __init__(self, accounts: Iterable[str], keep_alive_s: float, close: Closer) -> None:
        self.locks: dict[str, asyncio.Lock] = {a: asyncio.Lock() for a in accounts}
        self.keep_alive_s = keep_alive_s
        self._close = close
        self._sessions: dict[str, BrowserSession] = {}
        self._idle_since: dict[str, float] = {}
        self._closers: dict[str, asyncio.Task[None]] = {}
        # Closers past their wait, closing a browser: a stop waits for them
        # (a cancel would kill Chromium before it has written its profile).
        self._closing: set[asyncio.Task[None]] = set()
        self._preloads: dict[str, _Preload] = {}
        # A spare tab loading the model's page while the account's task generates.
        self._spares: dict[str, _Preload] = {}
        # Real seconds the account's last generation took: whether a spare
        # loaded at its start would still be fresh at its end.
        self._last_generation_s: dict[str, float] = {}
        # Tabs of finished conversations being closed, in the background: a
        # task does not wait for them (nothing reads those tabs again).
        self._tab_closers: dict[str, list[asyncio.Task[None]]] = {}
        # The last finished conversation's tab, kept for the next spare.
        self._parked: dict[str, Page] = {}
        # A parked tab that holds a loaded copy of the model's page (a
        # browser started before any task loads its first spare then):
        # (its url, when it had loaded: monotonic).
        self._parked_copy: dict[str, tuple[str, float]] = {}
        self._released: set[str] = set()
        # Tasks that have run on each account (`resume`): a browser start
        # asked for before one of them is not wanted any more.
        self._tasks_run: dict[str, int] = {}
        self.watcher: Watcher | None = None

    # -- used by the runner, under the account's lock -----------------------

    def session(self, account: str) -> BrowserSession | None:
        return self._sessions.get(account)

    def adopt(self, account: str, session: BrowserSession) -> None:
        """A browser just launched for the account: the one to kill or keep from now on."""
        self._sessions[account] = session

    def resume(self, account: str) -> None:
        """A task runs on the account: it is in service again."""
        self._released.discard(account)
        self._tasks_run[account] = self._tasks_run.get(account, 0) + 1

    def tasks_run(self, account: str) -> int:
        return self._tasks_run.get(account, 0)

    def reopen(self, account: str) -> None:
        """The account's lane has opened (before any task): in service again."""
        self._released.discard(account)

    def prestarted(
        self,
        account: str,
        session: BrowserSession,
        page: Page,
        url: str,
        loaded_at: float,
        *,
        spare_tab: Page | None = None,
        spare_loaded_at: float | None = None,
    ) -> bool:
        """A browser started before the account's first task, `page` loaded on
        `url` (at `loaded_at`, monotonic) and checked: kept like one a task
        left, closed when idle; `spare_tab` is parked for the first task's
        spare, with `url` loaded in it at `spare_loaded_at` unless None.
        False when it should be closed instead (keep-alive off, the account
        was taken out of service meanwhile, the browser is unwell)."""
        if self.keep_alive_s <= 0 or account in self._released or not session.usable:
            return False
        self._sessions[account] = session
        if spare_tab is not None:
            self._parked[account] = spare_tab
            if spare_loaded_at is not None:
                self._parked_copy[account] = (url, spare_loaded_at)
        self._idle_since[account] = time.monotonic()
        self._preloads[account] = _Preload(
            url, asyncio.create_task(_loaded(page, loaded_at), name=f"pre-started {account}")
        )
        self._close_after(account, session, self.keep_alive_s)
        self._settled(account)
        return True

    async def close(self, account: str, session: BrowserSession, log: Log) -> None:
        """Stop keeping the account's browser and close it (gracefully, then by kill)."""
        await self.forget(account)
        await self._close(session, log)

    def idle_s(self, account: str) -> float:
        return time.monotonic() - self._idle_since.get(account, time.monotonic())

    def idle_since(self, account: str) -> float:
        """When the account's browser was last handed back (monotonic)."""
        return self._idle_since.get(account, time.monotonic())

    def busy(self, account: str) -> bool:
        """A task, a start or an operator holds the account (its browser is not idle)."""
        lock = self.locks.get(account)
        return lock is None or lock.locked()

    async def forget(self, account: str) -> None:
        """The account's browser is being closed or killed by the caller: stop tracking it."""
        self._sessions.pop(account, None)
        if self.watcher is not None:
            self.watcher.gone(account)
        await self._drop_preload(account)

    async def evict(self, account: str, why: str) -> bool:
        """Close the account's kept browser now if it is idle; False if it is
        not (a task has just picked it up, or it is gone). Returns once closed."""
        lock = self.locks.get(account)
        session = self._sessions.get(account)
        if lock is None or session is None or lock.locked():
            return False
        # Taken at once (it is free): no task can pick the browser up meanwhile.
        async with lock:
            if self._sessions.get(account) is not session:
                return False
            closer = self._closers.pop(account, None)
            if closer is not None:
                closer.cancel()
            log = logging.getLogger(f"dispatcher.lane.web:{account}")
            idle_s = self.idle_s(account)
            await self.forget(account)
            log.info(
                "[web:%s] closing its browser (idle for %.1f s) %s",
                account,
                idle_s,
                why,
                extra={"lane": f"web:{account}"},
            )
            await self._close(session, log)
        return True

    def _settled(self, account: str) -> None:
        if self.watcher is not None:
            self.watcher.settled(account)

    async def preloaded(self, account: str, url: str) -> Preloaded | None:
        """Wait for the page loaded for this task; None if there is none.
        `fresh`: it loaded `url` less than `PRELOAD_FRESH_S` ago."""
        preload = self._preloads.pop(account, None)
        if preload is None:
            return None
        page, loaded_at = await preload.task
        if page is None:
            return None
        fresh = (
            loaded_at is not None
            and preload.url == url
            and time.monotonic() - loaded_at < PRELOAD_FRESH_S
        )
        return Preloaded(page, fresh)

    def spare(self, account: str, session: BrowserSession, url: str, prime: Primer) -> None:
        """The account's task has started generating: load the next task's page
        in a spare tab meanwhile, if it can still be fresh when this one ends
        and the browser is to be kept at all."""
        last_s = self._last_generation_s.get(account, 0.0)
        if (
            self.keep_alive_s <= 0
            or account in self._released
            or account in self._spares
            or last_s >= PRELOAD_FRESH_S / 2
        ):
            return
        parked = self._parked.pop(account, None)
        copy = self._parked_copy.pop(account, None)
        if (
            parked is not None
            and not parked.is_closed()
            and copy is not None
            and copy[0] == url
            and time.monotonic() - copy[1] < PRELOAD_FRESH_S / 2
        ):
            # Loaded when the browser started: loading it again now would
            # cost each of twenty accounts starting together a load while
            # they type (the others' first tasks, on two cores).
            job = _loaded(parked, copy[1])
        else:
            job = _load_spare(session.context, parked, url, prime)
        self._spares[account] = _Preload(
            url, asyncio.create_task(job, name=f"spare tab for {account}")
        )

    def keep(
        self,
        account: str,
        session: BrowserSession,
        page: Page,
        next_url: str,
        *,
        generation_s: float,
        prime: Primer | None = None,
    ) -> bool:
        """After a success: keep the browser with the next task's page (the
        spare tab, or `page` loaded again), close it when idle.

        False when it should be closed instead (keep-alive off, the account
        was taken out of service during the task, or the browser is unwell).
        """
        self._last_generation_s[account] = generation_s
        spare = self._spares.pop(account, None)
        if self.keep_alive_s <= 0 or account in self._released or not session.usable:
            if spare is not None:
                spare.task.cancel()  # the browser is closed with its tabs
            return False
        self._idle_since[account] = time.monotonic()
        closers = [t for t in self._tab_closers.get(account, []) if not t.done()]
        self._tab_closers[account] = closers
        # A tab parked earlier and not taken by a spare since (this task had
        # none: long generations): it would only hold memory.
        parked = self._parked.pop(account, None)
        self._parked_copy.pop(account, None)
        if parked is not None and parked is not page:
            closers.append(
                asyncio.create_task(_close_tab(parked), name=f"close a tab of {account}")
            )
        if spare is not None and spare.url == next_url:
            # The finished conversation's tab: the spare of the task after next.
            self._parked[account] = page
            self._preloads[account] = spare
        else:
            self._preloads[account] = _Preload(
                next_url,
                asyncio.create_task(
                    _load_in(page, next_url, prime), name=f"pre-load for {account}"
                ),
            )
            if spare is not None:
                closers.append(
                    asyncio.create_task(_discard(spare), name=f"close a spare tab of {account}")
                )
        self._close_after(account, session, self.keep_alive_s)
        self._settled(account)
        return True

    # -- accounts added and removed while running -------------------------------

    def add(self, account: str) -> None:
        self.locks.setdefault(account, asyncio.Lock())

    async def drop(self, account: str) -> None:
        """The account leaves: wait for its task to end, then close its browser for good."""
        lock = self.locks.get(account)
        if lock is None:
            return
        async with lock:
            closer = self._closers.pop(account, None)
            if closer is not None:
                closer.cancel()
            session = self._sessions.get(account)
            await self.forget(account)
            if session is not None and not session.closed:
                await self._close(session, logging.getLogger(f"dispatcher.lane.web:{account}"))
        self.locks.pop(account, None)
        self._idle_since.pop(account, None)
        self._last_generation_s.pop(account, None)
        self._released.discard(account)
        self._tasks_run.pop(account, None)

    # -- events from outside --------------------------------------------------

    def release(self, account: str) -> None:
        """Close the account's kept browser: now if idle, else when its task ends."""
        if account not in self.locks:
            return
        self._released.add(account)
        session = self._sessions.get(account)
        if session is not None and not self.locks[account].locked():
            self._close_after(account, session, 0.0)

    def on_event(self, event: Event) -> None:
        """Event-bus listener: an account taken out of service gives its browser back."""
        match event:
            case AccountChanged(name=name, kind=Kind.WEB, state=state) if state in _OUT_OF_SERVICE:
                self.release(name)

    def open_browsers(self) -> dict[str, int]:
        """The PID of each account's browser that is open (busy or kept)."""
        return {a: s.pid for a, s in self._sessions.items() if not s.closed}

    def open_processes(self) -> dict[str, subprocess.Popen[bytes]]:
        """Each account's open browser process (busy or kept), to measure."""
        return {a: s.process for a, s in self._sessions.items() if not s.closed}

    async def aclose(self) -> None:
        """Close the kept browsers gracefully (the profile is flushed); kill busy ones."""
        for closer in self._closers.values():
            closer.cancel()
        self._closers.clear()
        # Bounded: a close kills what has not exited after its grace period.
        await asyncio.gather(*self._closing, return_exceptions=True)
        log = logging.getLogger("dispatcher.webrunner")

        async def end(account: str, session: BrowserSession) -> None:
            await self._drop_preload(account)
            if self.locks[account].locked():
                await session.abort()  # its task's own cleanup was cut short
            else:
                await self._close(session, log)

        # All at once: twenty browsers closed one by one (each up to its grace
        # period on a loaded machine) outlast a service manager's stop timeout,
        # which then kills the service and leaves the browsers running.
        await asyncio.gather(*(end(a, s) for a, s in list(self._sessions.items())))
        self._sessions.clear()

    # -- internals ----------------------------------------------------------------

    async def _drop_preload(self, account: str) -> None:
        # (Its browser is being closed or killed: the parked tab goes with it.)
        self._parked.pop(account, None)
        self._parked_copy.pop(account, None)
        tasks: list[asyncio.Task[object]] = list(self._tab_closers.pop(account, []))
        for preloads in (self._preloads, self._spares):
            preload = preloads.pop(account, None)
            if preload is not None:
                tasks.append(preload.task)
        for task in tasks:
            with contextlib.suppress(PlaywrightError):
                await stop_background(task)

    def _close_after(self, account: str, session: BrowserSession, idle_limit_s: float) -> None:
        previous = self._closers.pop(account, None)
        if previous is not None:
            previous.cancel()
        log = logging.getLogger(f"dispatcher.lane.web:{account}")

        async def close_when_idle() -> None:
            await asyncio.sleep(idle_limit_s)
            async with self.locks[account]:
                idle_s = self.idle_s(account)
                # A task may have used it since this timer was set.
                if self._sessions.get(account) is not session or idle_s < idle_limit_s:
                    return
                me = asyncio.current_task()
                if me is not None:
                    if self._closers.get(account) is me:
                        del self._closers[account]
                    self._closing.add(me)
                    me.add_done_callback(self._closing.discard)
                await self.forget(account)
                log.info(
                    "[web:%s] closing its browser (idle for %.1f s)",
                    account,
                    idle_s,
                    extra={"lane": f"web:{account}"},
                )
                await self._close(session, log)

        self._closers[account] = asyncio.create_task(
            close_when_idle(), name=f"close the idle browser of {account}"
        )
