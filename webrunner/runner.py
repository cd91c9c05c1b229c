"""WebRunner: one attempt of a web task = one fresh Chromium on the account's profile.

A browser per task costs a launch, but it means no state leaks from one task
to the next and "no browser process of the account is left after a task"
holds by construction. The Playwright driver (a Node process) is kept for
the runner's lifetime since it is the same for every task.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections.abc import Mapping
from pathlib import Path

from playwright.async_api import Playwright, async_playwright

from dispatcher.clock import Clock
from dispatcher.errors import ConfigError, PermanentError, RunError, TaskCanceled
from dispatcher.models import Kind, Stage, Task
from dispatcher.profiles import Profile, WebSpec
from dispatcher.runner import RunContext, RunResult
from dispatcher.settings import Settings
from webrunner.browser import BrowserSession, ensure_user_data_dir, start_browser
from webrunner.lock import AccountLock
from webrunner.page import PAGE_READY_S, Budget, PageDriver, compose_message, guarded

# Real seconds for self-check, launch and CDP connect together (each step
# has its own, shorter bound; this one only keeps the sum finite).
START_LIMIT_S = 90.0

# An account name becomes a directory name; keep it boring.
_ACCOUNT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def browser_profiles_dir(state_dir: Path) -> Path:
    return state_dir / "browser"


def user_data_dir_for(state_dir: Path, account: str) -> Path:
    """Where an account's browser profile (its logged-in session) lives."""
    return browser_profiles_dir(state_dir) / account


class WebRunner:
    """Runs web-model tasks, one Chromium per task, for the accounts of the web profiles."""

    # A frozen page looks alive to asyncio: liveness is proven by beats that
    # happen only after page calls return.
    beats_required = True

    def __init__(
        self,
        settings: Settings,
        profiles: Mapping[str, Profile],
        clock: Clock,
        *,
        playwright: Playwright | None = None,
    ) -> None:
        """`playwright`: a driver to share (e.g. with `demo_login`); the caller stops it.

        Without one, `start` starts a driver and `aclose` stops it.
        """
        self._settings = settings
        self._clock = clock
        self._profiles = {n: p for n, p in profiles.items() if p.kind is Kind.WEB}
        accounts: set[str] = set()
        for profile in self._profiles.values():
            for account in profile.accounts:
                if not _ACCOUNT_NAME.match(account):
                    raise ConfigError(
                        f"profile {profile.source or profile.name}: web account name {account!r} "
                        "must be letters, digits, '.', '_' or '-' (it names a directory)"
                    )
                accounts.add(account)
        self.accounts: tuple[str, ...] = tuple(sorted(accounts))
        self._locks: dict[str, AccountLock] = {}
        self._running: dict[str, asyncio.Lock] = {a: asyncio.Lock() for a in self.accounts}
        # Counters the service's metrics read.
        self.stats: dict[str, int] = {"browser_launches": 0, "leftovers_ended": 0}
        self._sessions: dict[str, BrowserSession] = {}
        self._shared_playwright = playwright
        self._playwright: Playwright | None = None
        self._executable: str | None = None

    # -- lifecycle ---------------------------------------------------------

    def user_data_dir(self, account: str) -> Path:
        return user_data_dir_for(self._settings.state_dir, account)

    @property
    def web_profiles(self) -> Mapping[str, Profile]:
        return self._profiles

    @property
    def playwright(self) -> Playwright:
        """The driver, for helpers that open an account's profile (after `start`)."""
        if self._playwright is None:
            raise RuntimeError("WebRunner.start() has not run")
        return self._playwright

    @property
    def browser_executable(self) -> str:
        return self._executable or self._settings.browser()

    @property
    def headless(self) -> bool:
        return self._settings.headless

    @property
    def locks_dir(self) -> Path:
        return self._settings.state_dir / "locks"

    async def start(self) -> None:
        """Lock every account and start the Playwright driver.

        Raises LockHeld (naming the account) when another dispatcher holds
        one; nothing stays locked in that case.
        """
        if not self.accounts or self._locks:
            return
        executable = self._settings.browser()
        if not os.access(executable, os.X_OK):
            raise ConfigError(f"browser {executable} is not an executable file")
        self._executable = executable
        acquired: list[AccountLock] = []
        try:
            for account in self.accounts:
                lock = AccountLock(self.locks_dir, account)
                lock.acquire()
                acquired.append(lock)
                try:
                    ensure_user_data_dir(self.user_data_dir(account))
                except PermanentError as exc:
                    raise ConfigError(str(exc)) from exc
            self._playwright = self._shared_playwright or await async_playwright().start()
        except BaseException:
            for lock in acquired:
                lock.release()
            raise
        self._locks = {lock.account: lock for lock in acquired}

    async def aclose(self) -> None:
        """Kill any browser still open, stop the driver, release the locks."""
        for session in list(self._sessions.values()):
            await session.abort()
        self._sessions.clear()
        if self._playwright is not None:
            playwright, self._playwright = self._playwright, None
            if playwright is not self._shared_playwright:
                await playwright.stop()
        for lock in self._locks.values():
            lock.release()
        self._locks = {}

    # -- one attempt -------------------------------------------------------

    async def run(self, task: Task, ctx: RunContext) -> RunResult:
        spec = ctx.profile.web
        if spec is None:
            raise PermanentError(f"model {ctx.profile.name!r} has no [web] table", kind="config")
        account = ctx.account
        if account not in self._locks or self._playwright is None:
            raise PermanentError(
                f"web account {account!r} is not held by this runner (started: "
                f"{self._playwright is not None})",
                kind="config",
            )
        prompt = task.params.get("prompt")
        if not isinstance(prompt, str) or not prompt.strip():
            raise PermanentError("a web task needs a non-empty `prompt`", kind="input")
        message = compose_message(spec, prompt)
        # The scheduler never runs two tasks on one account; this only makes
        # a mistake there wait instead of opening the profile twice.
        async with self._running[account]:
            ctx.check_canceled()
            return await self._run_in_browser(ctx, account, message)

    def _generation_budget(self, spec: WebSpec) -> Budget:
        # The profile's timeout is nominal (scaled for tests and benchmarks);
        # starting a browser and loading a page take real time, bounded apart.
        return Budget.after(
            self._clock,
            self._clock.scaled(spec.timeout_s),
            f"the profile's timeout_s ({spec.timeout_s:g} s)",
        )

    async def _run_in_browser(self, ctx: RunContext, account: str, message: str) -> RunResult:
        assert self._playwright is not None and self._executable is not None
        spec = ctx.profile.web
        assert spec is not None
        t0 = time.monotonic()
        session: BrowserSession | None = None
        driver: PageDriver | None = None
        result: RunResult | None = None
        try:
            session = await guarded(
                ctx,
                start_browser(
                    self._playwright,
                    executable=self._executable,
                    user_data_dir=self.user_data_dir(account),
                    headless=self._settings.headless,
                    log=ctx.log,
                ),
                what="starting the browser",
                budget=Budget.after(self._clock, START_LIMIT_S, f"{START_LIMIT_S:.0f} s"),
                beat_while_waiting=True,
                discard=BrowserSession.kill_now,
            )
            self._sessions[account] = session
            self.stats["browser_launches"] += 1
            leftovers = session.selfcheck
            self.stats["leftovers_ended"] += len(leftovers.terminated) + len(leftovers.killed)
            page_budget = Budget.after(self._clock, PAGE_READY_S, f"{PAGE_READY_S:.0f} s")
            page = await guarded(ctx, session.page(), what="opening a tab", budget=page_budget)
            driver = PageDriver(page, spec, ctx, budget=page_budget)
            await driver.open()
            t_ready = time.monotonic()
            ctx.check_canceled()
            driver.budget = self._generation_budget(spec)
            before = await driver.submit(message)
            await ctx.set_stage(Stage.GENERATING)
            text = await driver.wait_answer(before)
            t_answer = time.monotonic()
            driver.budget = self._generation_budget(spec)
            files = await driver.download_media(await driver.media_sources(), ctx.result_dir)
            timings = {
                **session.timings_ms,
                "ready": (t_ready - t0) * 1000,
                "generation": (t_answer - t_ready) * 1000,
            }
            result = RunResult(
                text=text,
                files=files,
                meta={
                    "account": account,
                    "browser_pid": session.pid,
                    "timings_ms": {k: round(v, 1) for k, v in timings.items()},
                    "selfcheck": None if session.selfcheck.clean else session.selfcheck.to_json(),
                },
            )
            return result
        except TaskCanceled:
            clicked = await driver.click_stop() if driver is not None else False
            ctx.log.info(
                "canceled%s; closing the browser",
                " after clicking stop" if clicked else "",
            )
            raise
        except asyncio.CancelledError:
            # The core reclaimed the task (stale) or is shutting down. Kill
            # first, synchronously: the page may be frozen, and the account's
            # slot is freed only once this coroutine has finished.
            if session is not None:
                self._sessions.pop(account, None)
                await session.abort()
                ctx.log.warning(
                    "run interrupted; browser pid %d killed%s",
                    session.pid,
                    f" (survivors: {session.survivors})" if session.survivors else "",
                )
            raise
        except RunError as exc:
            ctx.log.warning("attempt failed (%s): %s", exc.kind, exc)
            raise
        finally:
            if session is not None and not session.closed:
                self._sessions.pop(account, None)
                graceful = await session.close(ctx.log)
                close_ms = session.timings_ms.get("close", 0.0)
                ctx.log.info(
                    "browser pid %d closed %s in %.0f ms",
                    session.pid,
                    "gracefully" if graceful else "by kill",
                    close_ms,
                )
                if session.survivors:
                    ctx.log.error(
                        "browser processes %s of profile %s survived SIGKILL",
                        session.survivors,
                        session.user_data_dir,
                    )
                if result is not None:
                    # What a task pays for its own browser: start and page
                    # load before the prompt, close after the answer.
                    timings_ms = result.meta["timings_ms"]
                    timings_ms["close"] = round(close_ms, 1)
                    timings_ms["overhead"] = round(timings_ms["ready"] + close_ms, 1)

    def __repr__(self) -> str:
        return f"WebRunner(accounts={list(self.accounts)}, started={self._playwright is not None})"
