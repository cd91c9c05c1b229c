"""An account's browser started when its lane opens, before its first task.

Starting Chromium (self-check, launch, CDP connect) and loading the model's
page cost the first task of a lane about a second, in series with the
account's generations. Started when the lane opens instead, the first task
finds the browser as a later task finds one kept by the keeper: open, on a
freshly loaded and primed copy of the model's page.

It is the same start as a task's: under the account's lock (so no task and
no operator's login uses the profile meanwhile), through `start_browser`
(the self-check, then the launch on the model's page), and the page is
checked with the task's own page check (`PageDriver.open`: the logged-in,
logged-out, human-check and usage-cap markers in one look). A page that
shows a login problem meets what a task's check raises (`AuthError`,
`AccountHold`); the browser is closed, as after a failed attempt, and the
caller's `hold` hands it to the account's health while the lock is still
held: a removal of the account waits for it, as it waits for a task. A kept
pre-started browser is closed after `keep_alive_s` idle like any kept
browser.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from playwright.async_api import Error as PlaywrightError
from playwright.async_api import Page

from dispatcher.clock import Clock
from dispatcher.errors import AccountHold, AuthError
from dispatcher.models import Stage
from dispatcher.profiles import WebSpec
from dispatcher.scheduling.protocol import timed_out
from dispatcher.scheduling.running import TaskLog
from webrunner.browser import BrowserSession
from webrunner.guard import own_page
from webrunner.keeper import PRELOAD_TIMEOUT_S, PRIME_TIMEOUT_S, load_copy
from webrunner.looks import prime
from webrunner.page import PAGE_READY_S, PageDriver, started_on
from webrunner.pagestep import Budget
from webrunner.runner import START_LIMIT_S, WebRunner

T = TypeVar("T")

# What a login problem found on the page does to the account (its health's call).
Hold = Callable[[AuthError | AccountHold], Awaitable[None]]


class PrestartContext:
    """What the page check needs (`pagestep.PageContext`) when no task runs: no
    cancel to notice (a stop cancels the start itself), no stage to report,
    no heartbeat to write; only bounded waits."""

    def __init__(self, account: str, clock: Clock) -> None:
        self.owner = account
        self.clock = clock

    def check_canceled(self) -> None:
        return None

    def beat(self) -> None:
        return None

    async def set_stage(
        self, stage: Stage, progress: float | None = None, queue_position: int | None = None
    ) -> None:
        return None

    async def guard(
        self,
        work: Awaitable[T],
        budget_s: float | None = None,
        *,
        what: str = "waiting",
        budget_label: str | None = None,
        alive: bool = False,
    ) -> T:
        timeout = asyncio.timeout(budget_s)
        try:
            async with timeout:
                return await work
        except TimeoutError:
            if timeout.expired():
                assert budget_s is not None
                raise timed_out(budget_s, what, budget_label) from None
            raise


def lane_log(account: str) -> TaskLog:
    """The lane's logger, its lines prefixed as a task's are (no task here)."""
    lane = f"web:{account}"
    return TaskLog(logging.getLogger(f"dispatcher.lane.{lane}"), {"lane": lane})


async def prestart_browser(
    runner: WebRunner,
    account: str,
    spec: WebSpec,
    *,
    wanted: Callable[[], bool],
    tasks_seen: int,
    hold: Hold,
) -> bool:
    """Start `account`'s browser on `spec`'s page and keep it for its first task.

    False when nothing was started: the account has a browser already, a
    task has run on it since the start was asked for (`tasks_seen`: the
    keeper's count then), it is not `wanted` any more (checked under the
    lock, just before the launch), or it was taken out of service during
    the start (then the browser is closed again), or its page showed a login
    problem (`AuthError`, `AccountHold`: the browser is closed, then `hold`
    is given the problem, the lock still held). Raises what else the start
    or the page check raised (`RunError`), with the browser closed.
    """
    keeper = runner.keeper
    lock = keeper.locks.get(account)
    if lock is None:
        return False  # removed meanwhile
    log = lane_log(account)
    async with lock:
        if (
            keeper.session(account) is not None
            or keeper.tasks_run(account) != tasks_seen
            or not wanted()
        ):
            return False
        keeper.reopen(account)
        if not await runner.memory.make_room(account, log, for_task=False):
            log.info("no browser started before the lane's first task: no room in the budget")
            return False
        t0 = time.monotonic()
        # Known to the keeper once launched: a stop or an operator's login
        # that comes now finds it (and waits for the lock held here).
        async with asyncio.timeout(START_LIMIT_S):
            session = await runner.launch_browser(account, spec, log)
        try:
            page, loaded_at = await _checked_page(runner.clock, account, session, spec)
            spare_tab, spare_loaded_at = await _spare_tab(session, page, spec)
        except asyncio.CancelledError:
            await keeper.forget(account)
            await session.abort()
            raise
        except BaseException as exc:
            log.warning("browser pid %d started before any task: %s; closing it", session.pid, exc)
            await keeper.close(account, session, log)
            if not isinstance(exc, AuthError | AccountHold):
                raise
            # Under the lock: a removal takes it before the account is
            # forgotten, so the mark cannot land after and bring it back.
            await hold(exc)
            return False
        if not keeper.prestarted(
            account,
            session,
            page,
            spec.url,
            loaded_at,
            spare_tab=spare_tab,
            spare_loaded_at=spare_loaded_at,
        ):
            log.info("browser pid %d not kept (the account left service); closing it", session.pid)
            await keeper.close(account, session, log)
            return False
        runner.counts["browser_prestarts"] += 1
        log.info(
            "browser pid %d started before the lane's first task, on %s (%.0f ms)",
            session.pid,
            spec.url,
            (time.monotonic() - t0) * 1000,
        )
        return True


async def _spare_tab(
    session: BrowserSession, page: Page, spec: WebSpec
) -> tuple[Page | None, float | None]:
    """A second tab for the first task's spare (`keeper.py`), the model's page
    loaded and primed in it, the checked page brought back in front of it:
    (the tab, None if it could not be had; when its page had loaded,
    monotonic, None if it did not: the first task loads it again).

    Opened and loaded now, while the host is quiet: a new tab costs Chromium
    a renderer and a compositor (about twice a load in a tab it has), and
    without it the first tasks of twenty accounts, starting together, would
    open twenty and load twenty pages at once while they type (twenty
    accounts on two cores: the first tasks' overhead 1.2-1.4 s, 1.0 with the
    tab opened here). The task types into the front tab: a tab behind has
    no animation frames to wait for."""
    try:
        async with asyncio.timeout(PRIME_TIMEOUT_S):
            tab = await own_page(session.context)
    except (PlaywrightError, TimeoutError):
        return None, None  # best effort, as a spare is: the first task opens one itself
    loaded_at = None
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(PRELOAD_TIMEOUT_S):
            loaded_at = await load_copy(tab, spec.url, functools.partial(prime, spec=spec))
    # Else the task brings it to front itself (`WebRunner._open_page`).
    with contextlib.suppress(PlaywrightError, TimeoutError):
        async with asyncio.timeout(PRIME_TIMEOUT_S):
            await page.bring_to_front()
    return tab, loaded_at


async def _checked_page(
    clock: Clock, account: str, session: BrowserSession, spec: WebSpec
) -> tuple[Page, float]:
    """The first tab on the model's page, checked as a task checks it, then
    primed; (the tab, when it was found loaded and checked: monotonic)."""
    ctx = PrestartContext(account, clock)
    budget = Budget.after(clock, PAGE_READY_S, f"{PAGE_READY_S:.0f} s")
    page = await session.page()
    loaded = await started_on(ctx, page, session.start_url, spec, budget)
    await PageDriver(page, spec, ctx, budget=budget).open(load=not loaded)
    loaded_at = time.monotonic()
    # Best effort, as for a spare tab: the task checks the page again itself.
    with contextlib.suppress(PlaywrightError, TimeoutError):
        async with asyncio.timeout(PRIME_TIMEOUT_S):
            await prime(page, spec)
    return page, loaded_at
