"""The running service: wires settings, store, lanes, runners and the HTTP API.

Start-up order matters: claim the state dir, load profiles, open the store,
reconcile what a previous run left running, then open the lanes and the API.
Each part started pushes its own undoing onto one exit stack, so a start that
fails halfway and a stop both undo exactly what was started, newest first.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

import filelock

from dispatcher.accounts.apikeys import check_keys
from dispatcher.accounts.roster import Roster
from dispatcher.accounts.switches import AccountBook
from dispatcher.accounts.warmup import BrowserPrewarm
from dispatcher.clock import Clock, SystemClock
from dispatcher.errors import ConfigError, LockHeld
from dispatcher.events import EventBus, ProfilesReloaded
from dispatcher.hosts.crosshost import RemoteTasks
from dispatcher.hosts.modelcards import publishable
from dispatcher.hosts.recovery import recover
from dispatcher.hosts.watch import HostWatch
from dispatcher.http.app import create_app
from dispatcher.http.security import Credentials
from dispatcher.logs import redact
from dispatcher.metrics import LoopLagProbe, Metrics, live_numbers
from dispatcher.models import JSON, Kind, State
from dispatcher.notify.webhooks import Webhooks
from dispatcher.profiles import ProfileProblem, read_profiles
from dispatcher.scheduling.allowances import AllowanceBook, allowances
from dispatcher.scheduling.budgets import BudgetBook, budget_limits
from dispatcher.scheduling.decisions import EXPIRE_AFTER_S
from dispatcher.scheduling.lanes import LaneSpec, build_lanes, with_added_accounts
from dispatcher.scheduling.protocol import Runner
from dispatcher.scheduling.scheduler import Scheduler
from dispatcher.service.demostartup import DemoStartup, start_demo
from dispatcher.service.eventloop import loop_name
from dispatcher.service.reload import plan_reload
from dispatcher.service.reload_apply import add_api_providers, reload_settings, why_not_live
from dispatcher.service.serving import RunningServer, start_server
from dispatcher.service.statedir import (
    LOCK_FILE,
    PORT_FILE,
    TOKEN_FILE,
    create_private_file,
    make_private_dir,
    make_private_files,
    probe_running,
    refuse_symlinks,
    sqlite_files,
    write_private,
)
from dispatcher.settings import Settings
from dispatcher.store import Store, dialect_of, open_store
from dispatcher.tasks.cache import ResultCache
from dispatcher.tasks.fingerprint import LocalFiles
from dispatcher.tasks.ledger import Ledger

if TYPE_CHECKING:
    from webrunner.runner import WebRunner

log = logging.getLogger("dispatcher.service")


class Phase(enum.Enum):
    """Where a service is in its one life: started once, stopped once."""

    NEW = "new"
    STARTING = "starting"
    STARTED = "started"
    STOPPED = "stopped"


class Service:
    """The composition root; start and stop it, or use it as an async context manager."""

    def __init__(
        self, settings: Settings, clock: Clock | None = None, *, demo: DemoStartup | None = None
    ) -> None:
        """`demo`: the demo's start-up step (`demo.bootstrap.Demo`), which
        settings.demo needs; the CLI passes it in, so the service itself
        never imports the demo."""
        self.settings = settings
        self._demo = demo
        self.clock: Clock = clock or SystemClock(settings.time_scale)
        self.pid = os.getpid()
        self.events = EventBus()
        self.credentials = Credentials.fresh()
        self.demo_servers: list[RunningServer] = []
        self.demo_urls: dict[str, str] = {}
        self.runners: dict[Kind, Runner] = {}
        # The web runner again, for the parts only it has (accounts, logins).
        self.web: WebRunner | None = None
        self.http: RunningServer | None = None
        self.phase = Phase.NEW
        # What stop undoes: set once start has finished, emptied by stop.
        self._parts: contextlib.AsyncExitStack | None = None
        self.recovery_summary: dict[str, int] = {}
        self.taken_over: dict[str, int] = {}  # dead hosts' tasks recovered here, by action
        self.lag_probe = LoopLagProbe()
        self.profile_problems: list[ProfileProblem] = []
        self._reloading = asyncio.Lock()
        # One lane rebuild at a time: each reads the profiles, the added
        # accounts and the leases, awaiting the store between them; two
        # interleaved (an account removed while a lost lease rebuilds) could
        # swap in the older picture last and reopen a removed account's lane.
        self._relaning = asyncio.Lock()
        self.remote: RemoteTasks | None = None  # other hosts' writes (PostgreSQL only)
        # Web accounts' browsers started as their lanes open (a web runner only).
        self.prewarm: BrowserPrewarm | None = None

    @property
    def state_dir(self) -> Path:
        return self.settings.state_dir

    @property
    def url(self) -> str:
        assert self.http is not None
        return self.http.url

    # -- start ---------------------------------------------------------------
    async def _claim_state_dir(self, stack: contextlib.AsyncExitStack) -> None:
        # Everything the service writes (database, results, logs of prompts)
        # is for this user only; restored at stop for in-process callers.
        stack.callback(os.umask, os.umask(0o077))
        make_private_dir(self.state_dir, "state dir")
        refuse_symlinks([self.state_dir / LOCK_FILE], "lock file")
        lock = filelock.FileLock(str(self.state_dir / LOCK_FILE), timeout=0)
        try:
            lock.acquire()
        except filelock.Timeout as exc:
            port = await probe_running(self.state_dir)
            where = f" and answers on 127.0.0.1:{port}" if port else ""
            raise LockHeld(
                f"another dispatcher is running on state dir {self.state_dir}{where}; "
                "stop it first (or use another DISPATCHER_STATE_DIR)"
            ) from exc
        stack.callback(lock.release)

    def _make_runners(self, kinds: set[Kind], concurrency: dict[str, int]) -> None:
        if Kind.API in kinds:
            from apirunner.runner import ApiRunner

            self.runners[Kind.API] = ApiRunner(
                self.settings,
                self.profiles,
                self.clock,
                concurrency,
                shared_gates=self.store if self.hosts.shared else None,
            )
        if Kind.WEB in kinds:
            from webrunner.runner import WebRunner

            self.web = WebRunner(self.settings, self.profiles, self.clock)
            self.events.listen(self.web.on_event)  # a disabled account's kept browser is closed
            self.runners[Kind.WEB] = self.web

    async def check_api_keys(self) -> None:
        """Keys read again; see `apikeys.check_keys`."""
        await check_keys(self.profiles.values(), self.accounts)

    def _effective_concurrency(self, lane: LaneSpec) -> int:
        runner = self.runners.get(lane.kind)
        if runner is None:
            return lane.concurrency
        return runner.effective_concurrency(lane.owner, lane.concurrency)

    async def start(self) -> None:
        """Start every part in order; on a failure, stop the ones started, newest first."""
        if self.phase is not Phase.NEW:
            raise RuntimeError(f"a service starts once; this one is {self.phase.value}")
        self.phase = Phase.STARTING
        async with contextlib.AsyncExitStack() as stack:
            stack.callback(self._mark_stopped)
            await self._claim_state_dir(stack)
            await self._start_parts(stack)
            self._parts = stack.pop_all()
        self.phase = Phase.STARTED

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.stop()

    async def _start_parts(self, stack: contextlib.AsyncExitStack) -> None:
        settings = self.settings
        self.lag_probe.start()
        stack.push_async_callback(self.lag_probe.stop)
        # Before the demo puts its sample image in the inputs dir.
        make_private_dir(settings.results_dir, "results dir")
        make_private_dir(self.state_dir / "cache", "cache dir")
        if not settings.input_dirs:
            make_private_dir(self.state_dir / "inputs", "inputs dir")
        if settings.demo:
            self.demo_urls = await start_demo(self._demo, self.demo_servers, stack, settings)
        found = read_profiles(settings.profiles_dir, self.demo_urls)
        self.profiles = found.profiles
        self.profile_problems = found.problems
        for problem in found.problems:
            log.error("%s; its model refuses tasks until it is fixed and reloaded", problem)
        if not self.profiles:
            why = "; ".join(str(p) for p in found.problems)
            why = why or "start with --demo for the bundled ones"
            raise ConfigError(f"no usable profiles in {settings.profiles_dir} ({why})")
        for profile in self.profiles.values():
            for provider in profile.provider_names:
                spec = profile.api_for(provider)
                for name in (spec.auth_env, spec.auth_secret_env):
                    if name:
                        redact(os.environ.get(name))
        lanes = build_lanes(self.profiles, settings)
        database = sqlite_files(settings.resolved_database_url)
        refuse_symlinks(database, "database file")
        # Private before SQLite opens them (one an older version made 0644; a
        # new one made 0600 here): SQLite gives its -wal and -shm files the
        # database's own mode. Never opened again once SQLite holds them: a
        # close of any descriptor on a file drops every POSIX lock this
        # process holds on it, SQLite's included; another process (a backup,
        # `sqlite3`) would then take the database for unused and re-initialise
        # the shared-memory file under our feet (SIGBUS in the service).
        create_private_file(database[0] if database else None)
        make_private_files(database)
        self.store: Store = await open_store(settings.resolved_database_url, settings.host_id)
        stack.push_async_callback(self.store.close)
        self.cache = ResultCache(
            self.store.cache_index,
            self.state_dir / "cache",
            self.clock,
            max_bytes=settings.cache_max_bytes,
            ttl_s=settings.cache_ttl_s,
        )
        self.cache.startup()
        self.hosts = HostWatch(
            self.store,
            self.clock,
            settings.host_id,
            shared=dialect_of(settings.resolved_database_url) == "postgresql",
            on_dead=self._take_over,
            on_lost=self._on_lease_lost,
        )
        await self.hosts.register()
        # Beating from here on: a start that takes longer than the stale bound
        # (browsers, logins) must not get this host declared dead, nor let its
        # leases lapse. Released last at stop, once the runs have stopped.
        self.hosts.start()
        stack.push_async_callback(self.hosts.aclose)
        lanes = with_added_accounts(lanes, await self.store.get_web_accounts(), self.profiles)
        # Runners for every kind configured: a web account refused now (another
        # host holds it) may be taken on by a reload once that host lets it go.
        kinds = {lane.kind for lane in lanes.values()}
        configured = lanes
        lanes = await self._bound(lanes)
        self.accounts = await AccountBook.load(self.store, self.clock, self.events)
        await self.accounts.ensure((lane.owner, lane.kind) for lane in lanes.values())
        await self.check_api_keys()
        self.ledger = Ledger(
            self.store,
            self.clock,
            self.profiles,
            self.events,
            retry_delay_s=settings.retry_delay_s,
            cache=self.cache,
            results_dir=settings.results_dir,
            reference_files=LocalFiles.under(
                settings.resolved_input_dirs, settings.max_reference_image_bytes
            ),
            host=settings.host_id,
            shared=self.hosts.shared,
        )
        self.ledger.invalid_models = found.invalid_models()
        await self._publish(lanes)
        concurrency = {
            lane.owner: lane.concurrency for lane in lanes.values() if lane.kind is Kind.API
        }
        self._make_runners(kinds, concurrency)
        for runner in self.runners.values():
            # Pushed before start: a runner's aclose undoes a start that failed halfway.
            stack.push_async_callback(_close_runner, runner)
            await runner.start()
        web = self.web
        for lane in lanes.values():
            if web is not None and lane.kind is Kind.WEB:
                web.add_owner(lane.owner)  # one added at run time (the rest are held)
        self._tell_web(configured)
        if self._demo is not None and settings.demo and web is not None:
            await self._demo.log_in(web, self.demo_urls)
        self.scheduler = Scheduler(
            ledger=self.ledger,
            clock=self.clock,
            lanes=lanes,
            runners=self.runners,
            accounts=self.accounts,
            profiles=self.profiles,
            results_dir=settings.results_dir,
            failures_for_attention=settings.account_failures_for_attention,
            effective_concurrency=self._effective_concurrency,
            claim_guard=self.hosts.guard,
            shared_queues=dialect_of(settings.resolved_database_url) == "postgresql",
            budgets=BudgetBook(
                budget_limits(self.profiles.values(), settings.budgets),
                self.store,
                events=self.events,
            ),
            allowances=AllowanceBook(
                allowances(self.profiles.values()), self.store.generations_since
            ),
        )
        if web is not None:
            self.prewarm = BrowserPrewarm(
                web=web,
                accounts=self.accounts,
                health=self.scheduler.health,
                profiles=self.profiles,
                enabled=settings.browser_prewarm,
            )
            self.events.listen(self.prewarm.on_event)
            # Closed before the runners are: a start under way closes what it launched.
            stack.push_async_callback(self.prewarm.aclose)
            # After any demo login (it holds the profiles) and before the
            # scheduler claims a task; in the background: serving is not delayed.
            self.prewarm.lanes_changed(lanes)
        self.roster = Roster(
            store=self.store,
            clock=self.clock,
            accounts=self.accounts,
            scheduler=self.scheduler,
            profiles=self.profiles,
            web=web,
            relane=self._relane,
            held_elsewhere=self.hosts.held_elsewhere,
        )
        # Read at scrape time: `metrics_payload` fills it just before rendering.
        self._scraped: dict[str, Any] = {}
        self.metrics = Metrics(lambda: self._scraped)
        self.events.listen(self.metrics.on_event)
        redact(settings.webhook_secret)
        self.webhooks = Webhooks(
            settings.webhook_urls,
            settings.webhook_secret,
            self.store,
            self.clock,
            self.accounts.views(),
            host=settings.host_id,
            deadline_s=settings.webhook_deadline_s,
            metrics=self.metrics,
        )
        if self.webhooks.enabled:
            self.events.listen(self.webhooks.on_event)
            stack.push_async_callback(self.webhooks.aclose)
            await self.webhooks.start()
        await self._reconcile()
        redact(self.credentials.token)
        self.http = await start_server(
            create_app(self, self.credentials), settings.port, http_parser=settings.http_parser
        )
        stack.push_async_callback(self._stop_http)
        # The hosts list names where each host's API answers.
        await self.hosts.register(self.http.url)
        # Event streams end before the server stops: an open one would hold
        # its graceful shutdown for the whole grace period.
        stack.callback(self.events.close)
        write_private(self.state_dir / TOKEN_FILE, self.credentials.token + "\n")
        write_private(self.state_dir / PORT_FILE, f"{self.http.port}\n")
        if dialect_of(settings.resolved_database_url) == "postgresql":
            # Other hosts' task writes reach this host's bus (wake-ups, cancels, SSE).
            self.remote = RemoteTasks(
                settings.resolved_database_url, settings.host_id, self.store, self.events
            )
            await self.remote.start()
            stack.push_async_callback(self.remote.aclose)
        self.scheduler.start()
        self.hosts.take_over_dead = True
        stack.push_async_callback(self.scheduler.shutdown)
        # Last in, first out: a draining account waits on the scheduler's
        # lanes, so it is given up before the scheduler stops them.
        stack.push_async_callback(self.roster.aclose)
        log.info(
            "dispatcher serving on %s (%s, %s; state dir %s, %d lanes: %s)",
            self.http.url,
            loop_name(),
            self.http.http_parser,
            self.state_dir,
            len(lanes),
            ", ".join(lanes),
        )

    async def _relane(self) -> None:
        """Lanes for the loaded profiles and the added web accounts, swapped in live."""
        async with self._relaning:
            lanes = build_lanes(self.profiles, self.settings)
            lanes = with_added_accounts(lanes, await self.store.get_web_accounts(), self.profiles)
            self._tell_web(lanes)
            lanes = await self._bound(lanes)
            await self.accounts.ensure((lane.owner, lane.kind) for lane in lanes.values())
            self.scheduler.replace_lanes(lanes)
            await self._publish(lanes)
            if self.prewarm is not None:
                self.prewarm.lanes_changed(lanes)

    async def _publish(self, lanes: Mapping[str, LaneSpec]) -> None:
        """The models this host runs, for the other hosts' intake (`modelcards`)."""
        models = {model for lane in lanes.values() for model in lane.models}
        await self.store.publish_models(self.settings.host_id, publishable(self.profiles, models))

    def _tell_web(self, lanes: Mapping[str, LaneSpec]) -> None:
        """The web runner learns which models each web account serves (a
        login or a cookie import opens the account on one of their pages),
        those another host holds now included: a lease may come later."""
        if self.web is not None:
            self.web.serve(
                {lane.owner: lane.models for lane in lanes.values() if lane.kind is Kind.WEB}
            )

    async def _bound(self, lanes: Mapping[str, LaneSpec]) -> dict[str, LaneSpec]:
        """The lanes this host may open: each web account leased to it (one
        refused before is asked again, so a reload picks up an account whose
        owner has gone)."""
        served = {lane.owner for lane in lanes.values() if lane.kind is Kind.WEB}
        for account in set(self.hosts.leases) - served:
            # Taken off this host: its lease goes once its last task has ended
            # (a drained removal comes back here when it has), so the account
            # can move without restarting this host.
            if not self.scheduler.lane_tasks(f"web:{account}"):
                await self.hosts.release(account)
        await self.hosts.bind(served)
        return self.hosts.bound(lanes)

    async def _on_lease_lost(self, account: str) -> None:
        if self.phase is Phase.STARTED:
            await self._relane()

    def refused_lanes(self) -> list[JSON]:
        """A lane per web account another host holds, for the lanes list."""
        return self.hosts.refused_lanes()

    async def _take_over(self, host: str) -> None:
        """A dead host's running tasks, recovered here by the start-up rules.

        All of them, its models loaded here or not: a web task goes back to
        the queue, for a host with an account of its model, and this is the
        one host that won `mark_host_dead`: nobody else will look again."""
        orphans = await self.store.tasks_in_state(State.RUNNING, host=host)
        counts = await recover(
            orphans,
            ledger=self.ledger,
            models={task.model for task in orphans},
            adopt=self.scheduler.adopt,
            now=self.clock.now(),
            expire_after_s=self.clock.scaled(EXPIRE_AFTER_S),
            retry_delay_s=self.clock.scaled(self.settings.retry_delay_s),
            what=f"taken over from dead host {host!r}",
            why=f"recovered from dead host {host!r}",
        )
        for action, n in counts.items():
            self.taken_over[action] = self.taken_over.get(action, 0) + n

    async def _reconcile(self) -> None:
        """Decide the fate of everything a previous run left running; log one line.

        On a shared database only this host's own tasks: the others' belong to
        live hosts, or to dead ones whose tasks `_take_over` recovers."""
        own = self.settings.host_id if self.hosts.shared else None
        self.recovery_summary = await recover(
            await self.store.tasks_in_state(State.RUNNING, host=own),
            ledger=self.ledger,
            models=self.profiles.keys(),
            adopt=self.scheduler.adopt,
            now=self.clock.now(),
            expire_after_s=self.clock.scaled(EXPIRE_AFTER_S),
            retry_delay_s=self.clock.scaled(self.settings.retry_delay_s),
        )

    async def metrics_payload(self) -> tuple[bytes, str]:
        self._scraped = await live_numbers(
            self.store,
            self.ledger,
            self.scheduler,
            self.accounts,
            self.runners.values(),
            self.lag_probe,
        )
        return self.metrics.render()

    # -- reload ----------------------------------------------------------------
    async def reload(self) -> JSON:
        """Re-read the profiles; apply what running lanes can serve; report what changed.

        Running tasks keep the profile they started with; pending tasks of a
        removed model wait (their answer says why) until it comes back.
        """
        # After the roster's add or remove under way (and before the next):
        # the profiles read may list the very account it takes or lets go.
        async with self._reloading, self.roster.changing:
            self.settings, settings_answer = reload_settings(
                self.settings, self.profiles, self.runners, self.cache
            )
            found = await asyncio.to_thread(
                read_profiles, self.settings.profiles_dir, self.demo_urls
            )
            plan = plan_reload(self.profiles, found, functools.partial(why_not_live, self.runners))
            lanes = build_lanes(plan.profiles, self.settings)
            await add_api_providers(self.runners, plan.profiles, lanes)
            # In place: the ledger and the scheduler hold this very mapping.
            self.profiles.clear()
            self.profiles.update(plan.profiles)
            self.profile_problems = found.problems
            self.ledger.invalid_models = {**plan.invalid, **plan.refused}
            if self.scheduler.budgets is not None:  # [budget] tables and DISPATCHER_BUDGETS
                self.scheduler.budgets.limits = budget_limits(
                    plan.profiles.values(), self.settings.budgets
                )
            if self.scheduler.allowances is not None:  # web profiles' daily_limit
                self.scheduler.allowances.replace(allowances(plan.profiles.values()))
            await self._relane()
            await self.check_api_keys()
        for problem in found.problems:
            log.error("reload: %s", problem)
        log.info("profiles reloaded: %s", plan.summary())
        answer = {**plan.to_json(found), **settings_answer}
        self.events.publish(ProfilesReloaded(answer))
        return answer

    def unloaded_note(self, model: str) -> str | None:
        """Why a pending task of `model` waits, when its model is not loaded."""
        if model in self.profiles:
            return None
        card = self.ledger.intake.elsewhere.get(model)
        if card is not None:
            return f"model {model!r} is run by host {', '.join(card.hosts)}, not this one"
        why = self.ledger.invalid_models.get(model)
        if why:
            return f"model {model!r} is not loaded ({why}); its tasks wait until it is"
        return f"model {model!r} is not loaded (profile removed); its tasks wait until it is back"

    # -- stop ------------------------------------------------------------------
    async def stop(self) -> None:
        """Stop what start started, newest first; a second call does nothing."""
        parts, self._parts = self._parts, None
        if parts is not None:
            await parts.aclose()
        elif self.phase is Phase.NEW:
            self._mark_stopped()

    def _mark_stopped(self) -> None:
        self.phase = Phase.STOPPED

    async def _stop_http(self) -> None:
        if self.http is not None:
            http, self.http = self.http, None
            await http.stop()
        with contextlib.suppress(OSError):
            (self.state_dir / PORT_FILE).unlink()


async def _close_runner(runner: Runner) -> None:
    # One runner failing to close must not keep the others (and the store,
    # the lock) from closing; its failure is logged, not raised from stop.
    try:
        await runner.aclose()
    except Exception:
        log.exception("closing the %s failed", type(runner).__name__)
