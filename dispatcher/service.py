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
import logging
import os
import signal
import stat
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

import filelock
import httpx
from pydantic import ValidationError

from dispatcher.accounts import AccountBook
from dispatcher.cache import ResultCache
from dispatcher.clock import Clock, SystemClock
from dispatcher.crosshost import RemoteTasks
from dispatcher.decisions import EXPIRE_AFTER_S
from dispatcher.errors import ConfigError, InputError, LockHeld
from dispatcher.events import EventBus, ProfilesReloaded
from dispatcher.fingerprint import LocalFiles
from dispatcher.hostwatch import HostWatch
from dispatcher.http.app import create_app
from dispatcher.http.security import Credentials
from dispatcher.lanes import LaneSpec, build_lanes, with_added_accounts
from dispatcher.ledger import Ledger
from dispatcher.logs import redact
from dispatcher.metrics import LoopLagProbe, Metrics
from dispatcher.models import JSON, Kind, State
from dispatcher.profiles import Profile, ProfileProblem, read_profiles
from dispatcher.recovery import recover
from dispatcher.reload import PINNED_SETTINGS, check_pools, live_changes, plan_reload
from dispatcher.roster import Roster
from dispatcher.runner import Runner
from dispatcher.scheduler import Scheduler
from dispatcher.serving import RunningServer, start_server
from dispatcher.settings import Settings
from dispatcher.store import Store, dialect_of, open_store
from dispatcher.webhooks import Webhooks

if TYPE_CHECKING:
    from webrunner.runner import WebRunner

log = logging.getLogger("dispatcher.service")

PORT_FILE = "port"
TOKEN_FILE = "token"
LOCK_FILE = "service.lock"


def read_state_file(state_dir: Path, name: str) -> str | None:
    try:
        return (state_dir / name).read_text().strip()
    except OSError:
        return None


def _write_private(path: Path, text: str) -> None:
    """Write a file only its owner can read, without a window where others could."""
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def _sqlite_files(url: str) -> list[Path]:
    """The database file and its WAL companions, for a SQLite URL."""
    if not url.startswith("sqlite:///"):
        return []
    main = Path(url.removeprefix("sqlite:///"))
    return [main, main.with_name(main.name + "-wal"), main.with_name(main.name + "-shm")]


def _make_private_dir(path: Path, what: str) -> None:
    """Create `path` 0700, or tighten it to 0700; refuse one another user owns.

    Another user's dir cannot be made private by us (they can always chmod
    it back), so the service refuses it rather than writing prompts there.
    """
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    info = path.stat()
    if info.st_uid != os.getuid():
        raise ConfigError(
            f"{what} {path} is owned by uid {info.st_uid}, not by this user (uid "
            f"{os.getuid()}); it holds prompts, results and the token, so it must be "
            "this user's own: use another DISPATCHER_STATE_DIR or chown it"
        )
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o077:
        os.chmod(path, 0o700)
        log.warning("%s %s was mode %o; tightened to 700", what, path, mode)


def _make_private_files(paths: list[Path]) -> None:
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            if stat.S_IMODE(path.stat().st_mode) != 0o600:
                os.chmod(path, 0o600)


async def probe_running(state_dir: Path) -> int | None:
    """The port of a dispatcher still answering for this state dir, if any."""
    port = read_state_file(state_dir, PORT_FILE)
    if not port or not port.isdigit():
        return None
    try:
        async with httpx.AsyncClient(timeout=1.0) as client:
            response = await client.get(f"http://127.0.0.1:{port}/healthz")
    except httpx.HTTPError:
        return None
    return (
        int(port) if response.headers.get("x-dispatcher") or response.status_code == 200 else None
    )


class Phase(enum.Enum):
    """Where a service is in its one life: started once, stopped once."""

    NEW = "new"
    STARTING = "starting"
    STARTED = "started"
    STOPPED = "stopped"


class Service:
    """The composition root; start and stop it, or use it as an async context manager."""

    def __init__(self, settings: Settings, clock: Clock | None = None) -> None:
        self.settings = settings
        self.clock: Clock = clock or SystemClock(settings.time_scale)
        self.pid = os.getpid()
        self.events = EventBus()
        self.credentials = Credentials.fresh()
        self.demo_servers: list[RunningServer] = []
        self.demo_urls: dict[str, str] = {}
        self.runners: dict[Kind, Runner] = {}
        self.http: RunningServer | None = None
        self.phase = Phase.NEW
        # What stop undoes: set once start has finished, emptied by stop.
        self._parts: contextlib.AsyncExitStack | None = None
        self.recovery_summary: dict[str, int] = {}
        self.taken_over: dict[str, int] = {}  # dead hosts' tasks recovered here, by action
        self.lag_probe = LoopLagProbe()
        self.profile_problems: list[ProfileProblem] = []
        self._reloading = asyncio.Lock()
        self.remote: RemoteTasks | None = None  # other hosts' writes (PostgreSQL only)

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
        _make_private_dir(self.state_dir, "state dir")
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

            web = WebRunner(self.settings, self.profiles, self.clock)
            self.events.listen(web.on_event)  # a disabled account's kept browser is closed
            self.runners[Kind.WEB] = web

    async def _check_api_keys(self) -> None:
        """A provider whose key variable is unset cannot run a task: it needs
        attention from the start, and its tasks wait instead of failing."""
        for profile in self.profiles.values():
            api, provider = profile.api, profile.provider
            if api is None or not api.auth_env or not provider or os.environ.get(api.auth_env):
                continue
            reason = f"its key is missing: the environment variable {api.auth_env} is unset"
            account = self.accounts.get(provider)
            if account.enabled and not (account.needs_attention and account.reason == reason):
                await self.accounts.needs_attention(provider, reason)

    def _effective_concurrency(self, lane: LaneSpec) -> int:
        runner = self.runners.get(lane.kind)
        if lane.kind is Kind.API and runner is not None:
            from apirunner.runner import ApiRunner

            if isinstance(runner, ApiRunner):
                return int(runner.effective_concurrency(lane.owner, lane.concurrency))
        return lane.concurrency

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
        if settings.demo:
            from demo.bootstrap import start_demos

            # Pushed first: start_demos lists each server as it comes up, so
            # one failing stops those before it.
            stack.push_async_callback(self._stop_demos)
            self.demo_urls = await start_demos(
                self.demo_servers,
                time_scale=settings.time_scale,
                state_dir=self.state_dir,
                input_dirs=settings.resolved_input_dirs,
            )
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
                auth_env = profile.api_for(provider).auth_env
                if auth_env:
                    redact(os.environ.get(auth_env))
        lanes = build_lanes(self.profiles, settings)
        _make_private_dir(settings.results_dir, "results dir")
        _make_private_dir(self.state_dir / "cache", "cache dir")
        if not settings.input_dirs:
            _make_private_dir(self.state_dir / "inputs", "inputs dir")
        database = _sqlite_files(settings.resolved_database_url)
        _make_private_files(database)  # one an older version made 0644
        self.store: Store = await open_store(settings.resolved_database_url, settings.host_id)
        stack.push_async_callback(self.store.close)
        _make_private_files(database)
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
        lanes = await self._bound(lanes)
        self.accounts = await AccountBook.load(self.store, self.clock, self.events)
        await self.accounts.ensure((lane.owner, lane.kind) for lane in lanes.values())
        await self._check_api_keys()
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
        concurrency = {
            lane.owner: lane.concurrency for lane in lanes.values() if lane.kind is Kind.API
        }
        self._make_runners(kinds, concurrency)
        for runner in self.runners.values():
            # Pushed before start: a runner's aclose undoes a start that failed halfway.
            stack.push_async_callback(_close_runner, runner)
            await runner.start()
        web = self._web_runner()
        for lane in lanes.values():
            if web is not None and lane.kind is Kind.WEB:
                web.add_account(lane.owner)  # one added at run time (the rest are held)
        if settings.demo and web is not None:
            from demo.bootstrap import log_in_demo_accounts

            await log_in_demo_accounts(web, self.demo_urls["DEMO_WEB_URL"])
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
        )
        self.roster = Roster(
            store=self.store,
            clock=self.clock,
            accounts=self.accounts,
            scheduler=self.scheduler,
            profiles=self.profiles,
            web=web,
            relane=self._relane,
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
        )
        if self.webhooks.enabled:
            self.events.listen(self.webhooks.on_event)
            stack.push_async_callback(self.webhooks.aclose)
            await self.webhooks.start()
        await self._reconcile()
        redact(self.credentials.token)
        self.http = await start_server(create_app(self, self.credentials), settings.port)
        stack.push_async_callback(self._stop_http)
        # Event streams end before the server stops: an open one would hold
        # its graceful shutdown for the whole grace period.
        stack.callback(self.events.close)
        _write_private(self.state_dir / TOKEN_FILE, self.credentials.token + "\n")
        (self.state_dir / PORT_FILE).write_text(f"{self.http.port}\n")
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
            "dispatcher serving on %s (state dir %s, %d lanes: %s)",
            self.http.url,
            self.state_dir,
            len(lanes),
            ", ".join(lanes),
        )

    def _web_runner(self) -> WebRunner | None:
        from webrunner.runner import WebRunner

        runner = self.runners.get(Kind.WEB)
        return runner if isinstance(runner, WebRunner) else None

    async def _relane(self) -> None:
        """Lanes for the loaded profiles and the added web accounts, swapped in live."""
        lanes = build_lanes(self.profiles, self.settings)
        lanes = with_added_accounts(lanes, await self.store.get_web_accounts(), self.profiles)
        lanes = await self._bound(lanes)
        await self.accounts.ensure((lane.owner, lane.kind) for lane in lanes.values())
        self.scheduler.replace_lanes(lanes)

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
        return [
            {
                "name": f"web:{account}",
                "kind": Kind.WEB.value,
                "owner": account,
                "account": account,
                "models": [],
                "concurrency": 0,
                "enabled": False,
                "needs_attention": False,
                "reason": refusal.message,
                "invalid": refusal.message,
                "refused": refusal.owner,
                "queued": 0,
                "running": [],
            }
            for account, refusal in sorted(self.hosts.refused.items())
        ]

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

    async def _live_numbers(self) -> dict[str, Any]:
        counters: dict[str, int] = {
            "dedup_hits": self.ledger.dedup_hits,
            "cache_hits": self.ledger.cache_hits,
            "retries": self.ledger.retries,
            "stale_reclaims": self.ledger.stale_reclaims,
            "stalled_reclaims": self.scheduler.stalled_reclaims,
        }
        remote: dict[tuple[str, str], int] = {}
        for runner in self.runners.values():
            stats = runner.stats()
            remote.update(stats.remote_requests)
            for key, value in stats.counters.items():
                counters[key] = counters.get(key, 0) + value
        return {
            "state_counts": await self.store.state_counts(),
            "lanes": await self.scheduler.lanes_view(),
            "accounts": self.accounts.views(),
            "counters": counters,
            "remote_requests": remote,
            "event_loop_lag_s": self.lag_probe.max_lag_s(),
        }

    async def metrics_payload(self) -> tuple[bytes, str]:
        self._scraped = await self._live_numbers()
        return self.metrics.render()

    # -- reload ----------------------------------------------------------------
    def _why_not_live(self, profile: Profile) -> str | None:
        """Why a new or changed profile cannot be served without a restart, if so.

        A web account it brings is taken on here (locked, its dir made), so
        that its lane can open with the reload.
        """
        runner = self.runners.get(profile.kind)
        if runner is None:
            kind = profile.kind.value
            return f"no {kind} runner was started (no {kind} model at start)"
        url = profile.api.base_url if profile.api else profile.web.url if profile.web else ""
        if not runner.allowlist.allows(url):
            return f"host of {url} is not on this run's outbound allowlist"
        web = self._web_runner()
        if profile.kind is Kind.WEB and web is not None:
            for account in profile.accounts:
                try:
                    web.add_account(account)
                except (InputError, LockHeld, ConfigError) as exc:
                    return str(exc)
        return None

    async def reload(self) -> JSON:
        """Re-read the profiles; apply what running lanes can serve; report what changed.

        Running tasks keep the profile they started with; pending tasks of a
        removed model wait (their answer says why) until it comes back.
        """
        async with self._reloading:
            settings_answer = self._reload_settings()
            found = await asyncio.to_thread(
                read_profiles, self.settings.profiles_dir, self.demo_urls
            )
            plan = plan_reload(self.profiles, found, self._why_not_live)
            lanes = build_lanes(plan.profiles, self.settings)
            await self._add_api_providers(plan.profiles, lanes)
            # In place: the ledger and the scheduler hold this very mapping.
            self.profiles.clear()
            self.profiles.update(plan.profiles)
            self.profile_problems = found.problems
            self.ledger.invalid_models = {**plan.invalid, **plan.refused}
            await self._relane()
        for problem in found.problems:
            log.error("reload: %s", problem)
        log.info("profiles reloaded: %s", plan.summary())
        answer = {**plan.to_json(found), **settings_answer}
        self.events.publish(ProfilesReloaded(answer))
        return answer

    def _reload_settings(self) -> JSON:
        """Read the settings again; apply the live ones (LIVE_SETTINGS) or say why not."""
        running = self.settings
        try:
            fresh = type(running)(**{name: getattr(running, name) for name in PINNED_SETTINGS})
            changed = live_changes(running, fresh)
            candidate = running.model_copy(update=changed)
            self._check_concurrency(candidate)
        except (ValidationError, ConfigError) as exc:
            log.error("reload: settings not applied: %s", exc)
            return {"settings": {}, "settings_error": str(exc)}
        self.settings = candidate
        web = self._web_runner()
        if web is not None:
            web.set_keep_alive(candidate.browser_keep_alive_s)
        self.cache.max_bytes = candidate.cache_max_bytes
        self.cache.ttl_s = candidate.cache_ttl_s
        if changed:
            log.info(
                "reload: settings changed: %s",
                ", ".join(f"{k}={v}" for k, v in sorted(changed.items())),
            )
        return {"settings": changed, "settings_error": None}

    def _check_concurrency(self, settings: Settings) -> None:
        from apirunner.runner import ApiRunner

        runner = self.runners.get(Kind.API)
        pools = runner.pool_size if isinstance(runner, ApiRunner) else lambda _: None
        check_pools(build_lanes(self.profiles, settings), pools)

    async def _add_api_providers(
        self, profiles: Mapping[str, Profile], lanes: Mapping[str, LaneSpec]
    ) -> None:
        """A client for every API provider a reload brought (on an allowed host)."""
        from apirunner.runner import ApiRunner

        runner = self.runners.get(Kind.API)
        if isinstance(runner, ApiRunner):
            concurrency = {
                lane.owner: lane.concurrency for lane in lanes.values() if lane.kind is Kind.API
            }
            await runner.add_profiles(profiles, concurrency)

    def unloaded_note(self, model: str) -> str | None:
        """Why a pending task of `model` waits, when its model is not loaded."""
        if model in self.profiles:
            return None
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

    async def _stop_demos(self) -> None:
        servers = list(self.demo_servers)
        self.demo_servers.clear()
        for server in servers:
            await server.stop()

    async def serve_forever(self) -> None:
        """Run until SIGTERM or SIGINT, then shut down gracefully."""
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        reloads: set[asyncio.Task[JSON]] = set()

        def on_hup() -> None:
            job = asyncio.create_task(self.reload(), name="reload")
            reloads.add(job)
            job.add_done_callback(reloads.discard)
            job.add_done_callback(_log_reload_failure)

        await self.start()
        loop.add_signal_handler(signal.SIGHUP, on_hup)
        try:
            await stop.wait()
            log.info("shutting down: running tasks stop at their checkpoints")
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                loop.remove_signal_handler(sig)
            await self.stop()


async def _close_runner(runner: Runner) -> None:
    # One runner failing to close must not keep the others (and the store,
    # the lock) from closing; its failure is logged, not raised from stop.
    try:
        await runner.aclose()
    except Exception:
        log.exception("closing the %s failed", type(runner).__name__)


def _log_reload_failure(job: asyncio.Task[JSON]) -> None:
    if not job.cancelled() and job.exception() is not None:
        log.error("reload on SIGHUP failed: %s", job.exception())
