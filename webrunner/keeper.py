"""Each web account's browser between tasks: kept open, pre-loaded, closed when idle.

Launching Chromium and connecting to it cost seconds, loading the model's
page a few hundred milliseconds more: both are paid on the account's lane,
in series with its generations. So after a task that succeeded the browser
stays open and starts loading a fresh copy of the model's page at once,
while the lane is between tasks; the next task of the account finds it
ready. What the keeper guarantees:

- an account has at most one browser, and the runner knows its PID;
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
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from playwright.async_api import Error as PlaywrightError
from playwright.async_api import Page

from dispatcher.events import AccountChanged, Event
from dispatcher.health import AccountState
from dispatcher.models import Kind
from webrunner.browser import BrowserSession, Log

# Real seconds. A page pre-loaded longer ago than this is loaded again: a
# site's page may hold tokens that go stale while nobody looks at it.
# States in which an account takes no task: its kept browser is given back.
_OUT_OF_SERVICE = frozenset({AccountState.DISABLED, AccountState.NEEDS_ATTENTION})
PRELOAD_FRESH_S = 30.0
PRELOAD_TIMEOUT_S = 30.0

Closer = Callable[[BrowserSession, Log], Awaitable[None]]


@dataclass
class _Preload:
    url: str
    task: asyncio.Task[float | None]  # -> when the page had loaded, None if it failed


async def _load(page: Page, url: str) -> float | None:
    try:
        await page.goto(url, wait_until="domcontentloaded", timeout=PRELOAD_TIMEOUT_S * 1000)
    except PlaywrightError:
        return None  # the next task loads it itself (or finds the browser dead)
    return time.monotonic()


class BrowserKeeper:
    def __init__(self, accounts: Iterable[str], keep_alive_s: float, close: Closer) -> None:
        self.locks: dict[str, asyncio.Lock] = {a: asyncio.Lock() for a in accounts}
        self.keep_alive_s = keep_alive_s
        self._close = close
        self._sessions: dict[str, BrowserSession] = {}
        self._idle_since: dict[str, float] = {}
        self._closers: dict[str, asyncio.Task[None]] = {}
        self._preloads: dict[str, _Preload] = {}
        self._released: set[str] = set()

    # -- used by the runner, under the account's lock -----------------------

    def session(self, account: str) -> BrowserSession | None:
        return self._sessions.get(account)

    def adopt(self, account: str, session: BrowserSession) -> None:
        """A browser just launched for the account: the one to kill or keep from now on."""
        self._sessions[account] = session

    def resume(self, account: str) -> None:
        """A task runs on the account: it is in service again."""
        self._released.discard(account)

    def idle_s(self, account: str) -> float:
        return time.monotonic() - self._idle_since.get(account, time.monotonic())

    async def forget(self, account: str) -> None:
        """The account's browser is being closed or killed by the caller: stop tracking it."""
        self._sessions.pop(account, None)
        await self._drop_preload(account)

    async def preloaded(self, account: str, url: str) -> bool:
        """Wait for the page loaded after the last task; True if it is `url` and still fresh."""
        preload = self._preloads.pop(account, None)
        if preload is None:
            return False
        loaded_at = await preload.task
        return (
            loaded_at is not None
            and preload.url == url
            and time.monotonic() - loaded_at < PRELOAD_FRESH_S
        )

    def keep(self, account: str, session: BrowserSession, page: Page, next_url: str) -> bool:
        """After a success: keep the browser, pre-load `next_url`, close it when idle.

        False when it should be closed instead (keep-alive off, the account
        was taken out of service during the task, or the browser is unwell).
        """
        if self.keep_alive_s <= 0 or account in self._released or not session.usable:
            return False
        self._idle_since[account] = time.monotonic()
        self._preloads[account] = _Preload(
            next_url, asyncio.create_task(_load(page, next_url), name=f"pre-load for {account}")
        )
        self._close_after(account, session, self.keep_alive_s)
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
        self._released.discard(account)

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

    async def aclose(self) -> None:
        """Close the kept browsers gracefully (the profile is flushed); kill busy ones."""
        for closer in self._closers.values():
            closer.cancel()
        self._closers.clear()
        log = logging.getLogger("dispatcher.webrunner")
        for account, session in list(self._sessions.items()):
            await self._drop_preload(account)
            if self.locks[account].locked():
                await session.abort()  # its task's own cleanup was cut short
            else:
                await self._close(session, log)
        self._sessions.clear()

    # -- internals ----------------------------------------------------------------

    async def _drop_preload(self, account: str) -> None:
        preload = self._preloads.pop(account, None)
        if preload is not None and not preload.task.done():
            preload.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await preload.task

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
