"""WebRunner: web tasks in a Chromium per account, launched and ended by us.

A task asks the account's browser keeper (`keeper.py`) for the browser kept
from the previous task, or launches one (self-check, start, CDP connect);
after a success the keeper keeps it, and after a failure, a cancel or a
reclaim the runner closes it (its state is suspect then). Either way the
only browser an account has is one whose PID the runner holds. The
Playwright driver (a Node process) lives as long as the runner.
"""

from __future__ import annotations

import asyncio
import functools
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from playwright.async_api import Playwright, async_playwright

from dispatcher.allowlist import Allowlist
from dispatcher.clock import Clock
from dispatcher.errors import (
    ConfigError,
    InputError,
    NotFound,
    PermanentError,
    RunError,
    TaskCanceled,
    TransientError,
)
from dispatcher.events import Event
from dispatcher.models import Kind, Stage, Task
from dispatcher.profiles import Profile, WebSpec
from dispatcher.refimages import Prepared
from dispatcher.scheduling.lanes import web_models_by_account
from dispatcher.scheduling.protocol import (
    Interruption,
    MemoryView,
    RunContext,
    Runner,
    RunnerStats,
    RunResult,
)
from dispatcher.settings import Settings
from dispatcher.tasks.fingerprint import LocalFiles
from webrunner import evidence
from webrunner.attach import load_references
from webrunner.browser import BrowserSession, Log, ensure_user_data_dir, start_browser
from webrunner.browserrun import (
    BrowserRun,
    add_close_timings,
    close_logged,
    keep_evidence,
    login_look,
    run_result,
    while_alive,
)
from webrunner.fields import set_fields
from webrunner.guard import (
    BrowserPolicy,
    clear_downloads,
    downloads_dir_for,
    install_guard,
    policy_for,
)
from webrunner.keeper import BrowserKeeper
from webrunner.lock import AccountLock
from webrunner.login import LoginDesk
from webrunner.looks import prime
from webrunner.media import download_media
from webrunner.memorygate import BrowserMemory
from webrunner.page import PAGE_READY_S, PageDriver, compose_message, started_on
from webrunner.pagestep import Budget, page_step
from webrunner.profiledirs import check_account_name, user_data_dir_for

# Real seconds for self-check, launch and CDP connect together (each step
# has its own, shorter bound; this one only keeps the sum finite).
START_LIMIT_S = 90.0


class WebRunner(Runner):
    """Runs web-model tasks, one Chromium per account at a time, for the web profiles."""

    # A frozen page looks alive to asyncio: liveness is proven by beats that
    # happen only after page calls return.
    beats_required = True
    # Media a page shows may live on any host the profiles name (the site, an
    # API vendor's CDN), and nowhere else: the API runner's list.
    allowlist: Allowlist

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
        self.clock = clock
        # The service's own mapping (a reload changes it in place).
        self._all_profiles = profiles
        self.allowlist = Allowlist.from_profiles(profiles)
        accounts: set[str] = set()
        for profile in self.web_profiles.values():
            for account in profile.accounts:
                try:
                    check_account_name(account, f"profile {profile.source or profile.name}: ")
                except InputError as exc:
                    raise ConfigError(str(exc)) from None
                accounts.add(account)
        self.accounts: tuple[str, ...] = tuple(sorted(accounts))
        # The models each account serves now: its profiles' at start, then
        # the lanes' (`serve`), which add run-time accounts and reloads.
        self._models: dict[str, tuple[str, ...]] = {
            account: tuple(sorted(p.name for p in listing))
            for account, listing in web_models_by_account(profiles).items()
        }
        self._locks: dict[str, AccountLock] = {}
        # Each account's browser between tasks (also one started before its first task).
        self.keeper = BrowserKeeper(self.accounts, settings.browser_keep_alive_s, close_logged)
        # The host's budget for the service and its browsers: every start passes it.
        self.memory = BrowserMemory(self.keeper, settings.browser_memory_budget_mb)
        # Counters the service's metrics read (`stats`).
        self.counts: dict[str, int] = {
            "browser_launches": 0,
            "browser_reuses": 0,
            "browser_prestarts": 0,  # started before the account's first task (`prewarm.py`)
            "leftovers_ended": 0,
        }
        self._shared_playwright = playwright
        self._playwright: Playwright | None = None
        self._executable: str | None = None
        # Operators' remote logins and session imports (`login.py`).
        self.logins = LoginDesk(self, clock)

    # -- lifecycle ---------------------------------------------------------

    def user_data_dir(self, account: str) -> Path:
        return user_data_dir_for(self._settings.state_dir, account)

    @property
    def web_profiles(self) -> dict[str, Profile]:
        """The web models loaded now (a reload may have changed them)."""
        return {n: p for n, p in self._all_profiles.items() if p.kind is Kind.WEB}

    def serve(self, models_by_account: Mapping[str, Sequence[str]]) -> None:
        """The web models each account serves from now on (its lane's)."""
        self._models = {account: tuple(sorted(m)) for account, m in models_by_account.items()}

    def models_of(self, account: str) -> tuple[str, ...]:
        """The web models the account serves (listed in a profile or added at run time)."""
        return self._models.get(account, ())

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
                acquired.append(self._lock_account(account))
            self._playwright = self._shared_playwright or await async_playwright().start()
        except BaseException:
            for lock in acquired:
                lock.release()
            raise
        self._locks = {lock.account: lock for lock in acquired}

    def _lock_account(self, account: str) -> AccountLock:
        """Lock the account's profile and make its user-data dir; LockHeld if another has it."""
        lock = AccountLock(self.locks_dir, account)
        lock.acquire()
        try:
            ensure_user_data_dir(self.user_data_dir(account))
        except PermanentError as exc:
            lock.release()
            raise ConfigError(str(exc)) from exc
        return lock

    def apply_settings(self, settings: Settings) -> None:
        """How long a browser stays open after a task, as a reload changed it."""
        self.keeper.keep_alive_s = settings.browser_keep_alive_s
        self.memory.budget_bytes = settings.browser_memory_budget_mb * 1024**2

    def add_owner(self, account: str) -> None:
        """Take on a web account while running: lock it, make its dir; it serves at once."""
        check_account_name(account)
        if account in self._locks:
            return
        if self._playwright is None:
            raise ConfigError("the web runner is not started; web accounts cannot be added")
        self._locks[account] = self._lock_account(account)
        self.keeper.add(account)
        self.accounts = tuple(sorted({*self.accounts, account}))

    async def remove_account(self, account: str) -> None:
        """Give an account up: once its running task (if any) ends, close its browser, unlock it."""
        await self.keeper.drop(account)
        lock = self._locks.pop(account, None)
        if lock is not None:
            lock.release()
        self.accounts = tuple(a for a in self.accounts if a != account)

    async def aclose(self) -> None:
        """Close the kept browsers, kill any still busy, stop the driver, release the locks."""
        await self.logins.aclose()
        await self.keeper.aclose()
        if self._playwright is not None:
            playwright, self._playwright = self._playwright, None
            if playwright is not self._shared_playwright:
                await playwright.stop()
        for lock in self._locks.values():
            lock.release()
        self._locks = {}

    # -- an operator's turn with a profile -------------------------------------

    def spec_for(self, account: str) -> WebSpec:
        """The [web] table of the first model (by name) the account serves."""
        for name in self.models_of(account):
            profile = self._all_profiles.get(name)
            if profile is not None and profile.web is not None:
                return profile.web
        raise NotFound(f"no web account {account!r}; known: {', '.join(self.accounts) or 'none'}")

    def _policy(self, account: str, spec: WebSpec) -> BrowserPolicy:
        return policy_for(
            spec,
            downloads_dir_for(self.user_data_dir(account)),
            self._settings.max_download_bytes,
        )

    def running_browser(self, account: str) -> BrowserSession | None:
        """The browser a task of the account is using now, if any (to watch it)."""
        session = self.keeper.session(account)
        if session is None or not session.usable or not self.keeper.locks[account].locked():
            return None
        return session

    # -- one attempt -------------------------------------------------------

    async def run(self, task: Task, ctx: RunContext) -> RunResult:
        spec = ctx.profile.web
        if spec is None:
            raise PermanentError(f"model {ctx.profile.name!r} has no [web] table", kind="config")
        account = ctx.owner
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
        files = LocalFiles.under(
            self._settings.resolved_input_dirs, self._settings.max_reference_image_bytes
        )
        images = await load_references(task.params, files, can_attach=spec.upload is not None)
        # The scheduler never runs two tasks on one account; this only makes
        # a mistake there wait instead of opening the profile twice. An
        # operator's login or import holds it for minutes: the task waits,
        # alive (beating) and cancellable, instead of being reclaimed as stale.
        lock = self.keeper.locks[account]
        if lock.locked():
            ctx.log.info(
                "waiting for the account's profile (its browser is starting, or a login or "
                "import holds it)"
            )
        await ctx.guard(lock.acquire(), alive=True)
        try:
            self.keeper.resume(account)
            return await self._run_in_browser(ctx, account, message, images, files)
        finally:
            lock.release()

    def _generation_budget(self, spec: WebSpec) -> Budget:
        # The profile's timeout is nominal (scaled for tests and benchmarks);
        # starting a browser and loading a page take real time, bounded apart.
        return Budget.after(
            self.clock,
            self.clock.scaled(spec.timeout_s),
            f"the profile's timeout_s ({spec.timeout_s:g} s)",
        )

    async def _session_for(
        self, ctx: RunContext, account: str, spec: WebSpec
    ) -> tuple[BrowserSession, bool]:
        """The account's open browser if it is still healthy, else a new one
        whose first tab starts loading the model's page at launch; (session, reused)."""
        session = self.keeper.session(account)
        if session is not None:
            if session.usable:
                self.counts["browser_reuses"] += 1
                idle_s = self.keeper.idle_s(account)
                ctx.log.info("reusing browser pid %d (idle %.1f s)", session.pid, idle_s)
                return session, True
            # Crashed or disconnected while idle: make sure it is gone, start afresh.
            await self._kill(account, session)
            ctx.log.warning(
                "browser pid %d died while idle; starting a new one (exit code %s)",
                session.pid,
                session.process.returncode,
            )
        # Outside the start's own budget: a wait for a running browser to be
        # handed back may take a generation's time (the task beats meanwhile).
        await ctx.guard(self.memory.make_room(account, ctx.log), alive=True)
        try:
            session = await page_step(
                ctx,
                self.launch_browser(account, spec, ctx.log),
                what="starting the browser",
                budget=Budget.after(self.clock, START_LIMIT_S, f"{START_LIMIT_S:.0f} s"),
                # Interrupted, it kills what it launched before it passes the
                # interrupt on (`start_browser`): nothing is left to dispose of.
                alive=True,
            )
        except BaseException:
            self.memory.gone(account)  # (a start never begun holds no room either)
            raise
        return session, False

    async def launch_browser(self, account: str, spec: WebSpec, log: Log) -> BrowserSession:
        """A new browser for the account (the self-check first), its first tab
        loading the model's page, known to the keeper at once and counted: a
        task's start and one before the account's first task (`prewarm.py`)
        alike. Call it under the account's lock.

        The caller names the model's [web] table: looked up from the models
        the account serves now, a task already running on an account whose
        removal is draining (its models gone from the lanes) would fail."""
        assert self._playwright is not None and self._executable is not None
        user_data_dir = self.user_data_dir(account)
        url = spec.url
        policy = self._policy(account, spec)
        clear_downloads(user_data_dir)
        try:
            session = await start_browser(
                self._playwright,
                executable=self._executable,
                user_data_dir=user_data_dir,
                headless=self._settings.headless,
                log=log,
                # Loaded at launch, the page would run before any route is in
                # place: with allowed hosts, the task loads it itself.
                start_url=None if policy.allow_hosts else url,
            )
        except BaseException:
            self.memory.gone(account)  # the room it was given is free again
            raise
        try:
            await install_guard(session, policy)
        except BaseException:
            # Interrupted (or failed) before the keeper knows it: nobody
            # else would ever close it.
            await session.abort()
            self.memory.gone(account)
            raise
        self.keeper.adopt(account, session)
        self.counts["browser_launches"] += 1
        leftovers = session.selfcheck
        self.counts["leftovers_ended"] += len(leftovers.terminated) + len(leftovers.killed)
        return session

    async def _open_page(
        self, ctx: RunContext, run: BrowserRun, spec: WebSpec, budget: Budget
    ) -> PageDriver:
        session = run.session
        assert session is not None
        preloaded = await page_step(
            ctx,
            while_alive(session, self.keeper.preloaded(ctx.owner, spec.url)),
            what=f"loading {spec.url}",
            budget=budget,
        )
        if preloaded is not None:
            page, fresh = preloaded.page, preloaded.fresh
            # A spare loaded in the parked tab is behind the tab that generated
            # meanwhile: Chromium gives a background tab no animation frames,
            # which the checks before a click wait for (Playwright's ~2 s;
            # `actions.py` waits 50 ms at most for one).
            await page_step(ctx, page.bring_to_front(), what="showing the tab", budget=budget)
        else:
            page = await page_step(ctx, session.page(), what="opening a tab", budget=budget)
            fresh = not run.reused and await started_on(ctx, page, session.start_url, spec, budget)
        run.page = page  # the tab the evidence shows, should `open` fail
        driver = PageDriver(page, spec, ctx, budget=budget)
        await driver.open(load=not fresh)
        return driver

    async def _run_in_browser(
        self,
        ctx: RunContext,
        account: str,
        message: str,
        images: Sequence[Prepared],
        inputs: LocalFiles,
    ) -> RunResult:
        run = BrowserRun(account)
        try:
            result = await self._generate(ctx, run, message, images, inputs)
        except TaskCanceled:
            with ctx.alive():
                clicked = await run.driver.click_stop() if run.driver is not None else False
                await self._keep_evidence(ctx, run)
            ctx.log.info(
                "canceled%s; closing the browser",
                " after clicking stop" if clicked else "",
            )
            raise
        except asyncio.CancelledError:
            await self._interrupted(ctx, run)
            raise
        except RunError as exc:
            ctx.log.warning("attempt failed (%s): %s", exc.kind, exc)
            # The outcome is known: a slow cleanup must not make the task
            # look hung (a stale reclaim would charge a logout an attempt).
            with ctx.alive():
                await self._keep_evidence(ctx, run)
                if exc.kind == "stalled" and run.session is not None:
                    # A stuck renderer may not close politely: kill, confirm dead.
                    await self._kill(account, run.session)
                held = await login_look(run, ctx.profile.web, exc, ctx.log)
            if held is not None:
                raise held from exc
            raise
        finally:
            if run.session is not None and not run.session.closed and not run.kept:
                # Not kept: after a failure or a cancel its state is suspect;
                # after a success, keep-alive is off or the account was released.
                with ctx.alive():
                    await self.keeper.forget(account)
                    await close_logged(run.session, ctx.log)
        add_close_timings(result, run)
        return result

    async def _generate(
        self,
        ctx: RunContext,
        run: BrowserRun,
        message: str,
        images: Sequence[Prepared],
        inputs: LocalFiles,
    ) -> RunResult:
        """Browser, page, prompt, answer, media: the attempt's happy path."""
        spec = ctx.profile.web
        assert spec is not None
        t0 = time.monotonic()
        driver = await self._ready_page(ctx, run, spec)
        t_ready = time.monotonic()
        ctx.check_canceled()
        driver.budget = self._generation_budget(spec)
        if spec.fields:
            shown = await set_fields(driver, ctx.task.params, inputs)
            ctx.log.info("fields set: %s", ", ".join(shown) or "none (the page's defaults)")
        before = await driver.submit(message, images)
        t_submitted = time.monotonic()
        assert run.session is not None
        # While it generates, the next task's page loads in a spare tab.
        self.keeper.spare(run.account, run.session, spec.url, functools.partial(prime, spec=spec))
        await ctx.set_stage(Stage.GENERATING)
        text = await driver.wait_answer(before)
        t_answer = time.monotonic()
        driver.budget = self._generation_budget(spec)
        files = await download_media(
            driver,
            await driver.media_sources(),
            ctx.result_dir,
            allowlist=self.allowlist,
            max_bytes=spec.max_download_bytes or self._settings.max_download_bytes,
        )
        result = run_result(run, text, files, (t0, t_ready, t_submitted, t_answer))
        session = run.session
        assert session is not None
        if run.tracing:
            await evidence.drop_trace(session.context)
        if session.guard is not None:
            await session.guard.settle()
        run.kept = self.keeper.keep(
            run.account,
            session,
            driver.page,
            spec.url,
            generation_s=t_answer - t_submitted,
            prime=functools.partial(prime, spec=spec),
        )
        return result

    async def _ready_page(self, ctx: RunContext, run: BrowserRun, spec: WebSpec) -> PageDriver:
        """The account's browser (kept or new) with the model's page ready for a prompt."""
        run.session, run.reused = await self._session_for(ctx, run.account, spec)
        await self._guard(ctx, run.session, spec)
        run.tracing = spec.trace and await evidence.start_trace(run.session.context, ctx.log)
        page_budget = Budget.after(self.clock, PAGE_READY_S, f"{PAGE_READY_S:.0f} s")
        try:
            run.driver = await self._open_page(ctx, run, spec, page_budget)
        except TransientError as exc:
            if not run.reused or exc.kind not in ("browser", "page_load"):
                raise
            # The kept browser died or broke while idle: nothing was sent
            # yet, so a fresh browser is the same attempt, not a retry.
            ctx.log.warning(
                "kept browser pid %d failed (%s); starting a new one", run.session.pid, exc
            )
            await self._kill(run.account, run.session)
            run.session, run.reused = await self._session_for(ctx, run.account, spec)
            await self._guard(ctx, run.session, spec)
            run.driver = await self._open_page(ctx, run, spec, page_budget)
        return run.driver

    async def _guard(self, ctx: RunContext, session: BrowserSession, spec: WebSpec) -> None:
        """This model's limits on the (maybe kept) browser: a kept one may
        have served another model of the account."""
        assert session.guard is not None
        await page_step(
            ctx,
            session.guard.apply(self._policy(ctx.owner, spec)),
            what="setting the browser's limits",
            budget=Budget.after(self.clock, PAGE_READY_S, f"{PAGE_READY_S:.0f} s"),
        )

    async def _interrupted(self, ctx: RunContext, run: BrowserRun) -> None:
        """The core reclaimed the task (stale) or is shutting down.

        Kill first, synchronously: the page may be frozen, and the account's
        slot is freed only once this coroutine has finished.
        """
        session = run.session
        if session is None:
            return
        if ctx.interruption is Interruption.RECLAIMED:
            await self._keep_evidence(ctx, run)
        await self._kill(run.account, session)
        ctx.log.warning(
            "run interrupted; browser pid %d killed%s",
            session.pid,
            f" (survivors: {session.survivors})" if session.survivors else "",
        )

    async def _keep_evidence(self, ctx: RunContext, run: BrowserRun) -> None:
        await keep_evidence(run, ctx.result_dir, self._settings.artifacts_retention, ctx.log)

    async def _kill(self, account: str, session: BrowserSession) -> None:
        """Kill the account's browser at once (dead, broken or frozen) and stop keeping it."""
        await self.keeper.forget(account)
        await session.abort()

    def stats(self) -> RunnerStats:
        return RunnerStats(
            counters={**self.counts, "browsers_closed_for_memory": self.memory.closed_for_room}
        )

    async def memory_view(self) -> MemoryView | None:
        return await self.memory.view()

    def on_event(self, event: Event) -> None:
        """Event-bus listener: a web account taken out of service gives its browser back."""
        self.keeper.on_event(event)

    def open_browsers(self) -> dict[str, int]:
        """The PID of each account's open browser (busy, or kept between tasks)."""
        return self.keeper.open_browsers()

    def __repr__(self) -> str:
        return f"WebRunner(accounts={list(self.accounts)}, started={self._playwright is not None})"
