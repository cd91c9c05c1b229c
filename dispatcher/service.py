"""The running service: wires settings, store, lanes, runners and the HTTP API.

Start-up order matters: claim the state dir, load profiles, open the store,
reconcile what a previous run left running, then open the lanes and the API.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import signal
import stat
from pathlib import Path
from typing import Any

import filelock
import httpx

from dispatcher.accounts import AccountBook
from dispatcher.cache import ResultCache
from dispatcher.clock import Clock, SystemClock
from dispatcher.decisions import EXPIRE_AFTER_S, RecoveryAction, plan_reclaims, plan_recovery
from dispatcher.errors import ConfigError, LockHeld
from dispatcher.events import EventBus
from dispatcher.fingerprint import LocalFiles
from dispatcher.http.app import create_app
from dispatcher.http.security import Credentials
from dispatcher.lanes import LaneSpec, build_lanes
from dispatcher.ledger import Ledger
from dispatcher.logs import redact
from dispatcher.metrics import LoopLagProbe, Metrics
from dispatcher.models import JSON, Kind, State, Task
from dispatcher.profiles import load_profiles
from dispatcher.runner import Runner
from dispatcher.scheduler import Scheduler
from dispatcher.serving import RunningServer, start_server
from dispatcher.settings import Settings
from dispatcher.store import Store, open_store
from dispatcher.webhooks import Webhooks

log = logging.getLogger("dispatcher.service")

PORT_FILE = "port"
TOKEN_FILE = "token"
DEMO_FILE = "demo.json"
LOCK_FILE = "service.lock"
DEMO_API_KEY_ENV = "DEMO_API_KEY"


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


class Service:
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
        self._lock: filelock.BaseFileLock | None = None
        self._umask: int | None = None
        self._stopped = asyncio.Event()
        self.recovery_summary: dict[str, int] = {}
        self.lag_probe = LoopLagProbe()

    @property
    def state_dir(self) -> Path:
        return self.settings.state_dir

    @property
    def url(self) -> str:
        assert self.http is not None
        return self.http.url

    # -- start ---------------------------------------------------------------
    async def _claim_state_dir(self) -> None:
        # Everything the service writes (database, results, logs of prompts)
        # is for this user only; restored at stop for in-process callers.
        self._umask = os.umask(0o077)
        _make_private_dir(self.state_dir, "state dir")
        self._lock = filelock.FileLock(str(self.state_dir / LOCK_FILE), timeout=0)
        try:
            self._lock.acquire()
        except filelock.Timeout as exc:
            port = await probe_running(self.state_dir)
            where = f" and answers on 127.0.0.1:{port}" if port else ""
            raise LockHeld(
                f"another dispatcher is running on state dir {self.state_dir}{where}; "
                "stop it first (or use another DISPATCHER_STATE_DIR)"
            ) from exc

    async def _start_demo(self) -> dict[str, str]:
        from demo.api_provider import start_demo_api
        from demo.comfyui import start_demo_comfy
        from demo.web_model import start_demo_web

        api = await start_demo_api(time_scale=self.settings.time_scale)
        self.demo_servers.append(api)
        urls = {"DEMO_API_URL": api.url}
        web = await start_demo_web(time_scale=self.settings.time_scale)
        self.demo_servers.append(web)
        urls["DEMO_WEB_URL"] = web.url
        comfy = await start_demo_comfy(time_scale=self.settings.time_scale)
        self.demo_servers.append(comfy)
        urls["DEMO_COMFY_URL"] = comfy.url
        if not os.environ.get(DEMO_API_KEY_ENV):
            os.environ[DEMO_API_KEY_ENV] = "demo-" + secrets.token_hex(12)
        redact(os.environ[DEMO_API_KEY_ENV])
        (self.state_dir / DEMO_FILE).write_text(json.dumps(urls, indent=2) + "\n")
        return urls

    def _make_runners(self, kinds: set[Kind], concurrency: dict[str, int]) -> None:
        if Kind.API in kinds:
            from apirunner.runner import ApiRunner

            self.runners[Kind.API] = ApiRunner(
                self.settings, self.profiles, self.clock, concurrency
            )
        if Kind.WEB in kinds:
            from webrunner.runner import WebRunner

            web = WebRunner(self.settings, self.profiles, self.clock)
            self.events.listen(web.on_event)  # a disabled account's kept browser is closed
            self.runners[Kind.WEB] = web

    def _check_api_keys(self) -> None:
        """A provider whose key variable is unset cannot run a task: it needs
        attention from the start, and its tasks wait instead of failing."""
        for profile in self.profiles.values():
            api, provider = profile.api, profile.provider
            if api is None or not api.auth_env or not provider or os.environ.get(api.auth_env):
                continue
            reason = f"its key is missing: the environment variable {api.auth_env} is unset"
            account = self.accounts.get(provider)
            if account.enabled and not (account.needs_attention and account.reason == reason):
                self.accounts.needs_attention(provider, reason)

    def _effective_concurrency(self, lane: LaneSpec) -> int:
        runner = self.runners.get(lane.kind)
        if lane.kind is Kind.API and runner is not None:
            from apirunner.runner import ApiRunner

            if isinstance(runner, ApiRunner):
                return int(runner.effective_concurrency(lane.account, lane.concurrency))
        return lane.concurrency

    async def start(self) -> None:
        try:
            await self._claim_state_dir()
        except BaseException:
            self._restore_umask()
            raise
        try:
            await self._start_inner()
        except BaseException:
            await self.stop()
            raise

    async def _start_inner(self) -> None:
        settings = self.settings
        self.lag_probe.start()
        if settings.demo:
            self.demo_urls = await self._start_demo()
        self.profiles = load_profiles(settings.profiles_dir, self.demo_urls)
        if not self.profiles:
            raise ConfigError(
                f"no usable profiles in {settings.profiles_dir} "
                "(start with --demo for the bundled ones)"
            )
        for profile in self.profiles.values():
            if profile.api and profile.api.auth_env:
                redact(os.environ.get(profile.api.auth_env))
        lanes = build_lanes(self.profiles, settings)
        for name in ("results", "cache"):
            _make_private_dir(self.state_dir / name, f"{name} dir")
        if not settings.input_dirs:
            _make_private_dir(self.state_dir / "inputs", "inputs dir")
        database = _sqlite_files(settings.resolved_database_url)
        _make_private_files(database)  # one an older version made 0644
        self.store: Store = open_store(settings.resolved_database_url)
        _make_private_files(database)
        self.cache = ResultCache(
            self.store,
            self.state_dir / "cache",
            self.clock,
            max_bytes=settings.cache_max_bytes,
            ttl_s=settings.cache_ttl_s,
        )
        self.cache.startup()
        self.accounts = AccountBook(self.store, self.clock, self.events)
        self.accounts.ensure((lane.account, lane.kind) for lane in lanes.values())
        self._check_api_keys()
        self.ledger = Ledger(
            self.store,
            self.clock,
            self.profiles,
            self.events,
            retry_delay_s=settings.retry_delay_s,
            cache=self.cache,
            results_dir=self.state_dir / "results",
            reference_files=LocalFiles.under(
                settings.resolved_input_dirs, settings.max_reference_image_bytes
            ),
        )
        concurrency = {
            lane.account: lane.concurrency for lane in lanes.values() if lane.kind is Kind.API
        }
        self._make_runners({lane.kind for lane in lanes.values()}, concurrency)
        for runner in self.runners.values():
            await runner.start()
        if settings.demo and Kind.WEB in self.runners:
            await self._login_demo_accounts()
        self.scheduler = Scheduler(
            ledger=self.ledger,
            clock=self.clock,
            lanes=lanes,
            runners=self.runners,
            accounts=self.accounts,
            profiles=self.profiles,
            results_dir=self.state_dir / "results",
            on_success=self._remember_result,
            failures_for_attention=settings.account_failures_for_attention,
            effective_concurrency=self._effective_concurrency,
        )
        self.metrics = Metrics(self._live_numbers)
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
            await self.webhooks.start()
        self._reconcile()
        redact(self.credentials.token)
        self.http = await start_server(create_app(self, self.credentials), settings.port)
        _write_private(self.state_dir / TOKEN_FILE, self.credentials.token + "\n")
        (self.state_dir / PORT_FILE).write_text(f"{self.http.port}\n")
        self.scheduler.start()
        log.info(
            "dispatcher serving on %s (state dir %s, %d lanes: %s)",
            self.http.url,
            self.state_dir,
            len(lanes),
            ", ".join(lanes),
        )

    async def _login_demo_accounts(self) -> None:
        """The demo site wants a login once per account; a real site's profile has one."""
        from demo.web_model import login_demo_accounts
        from webrunner.runner import WebRunner

        runner = self.runners[Kind.WEB]
        assert isinstance(runner, WebRunner)
        logged_in = await login_demo_accounts(runner, self.demo_urls["DEMO_WEB_URL"])
        if any(logged_in.values()):
            log.info(
                "demo accounts logged in: %s", ", ".join(a for a, new in logged_in.items() if new)
            )

    async def _remember_result(self, task: Task, result: JSON) -> None:
        # Linking or copying a video into the cache is file work: a thread
        # does it while the loop serves every other lane.
        if not task.from_cache:
            await asyncio.to_thread(self.cache.store_result, task.fingerprint, task.model, result)

    def _reconcile(self) -> None:
        """Decide the fate of everything a previous run left running; log one line."""
        now = self.clock.now()
        summary = {action.value: 0 for action in RecoveryAction}
        for task in self.store.tasks_in_state(State.RUNNING):
            if task.model not in self.profiles:
                continue
            action = plan_recovery(task, now=now, expire_after_s=self.clock.scaled(EXPIRE_AFTER_S))
            summary[action.value] += 1
            if action is RecoveryAction.EXPIRE:
                self.ledger.expire(task)
            elif action is RecoveryAction.REQUEUE:
                self.ledger.requeue(task, "recovered at start-up: never reached the provider")
            elif action is RecoveryAction.STALE:
                (plan,) = plan_reclaims(
                    [task],
                    now=now,
                    stale_after_s=-1.0,
                    retry_delay_s=self.clock.scaled(self.settings.retry_delay_s),
                )
                self.ledger.reclaim(task, plan)
            elif not self.scheduler.adopt(task):
                self.ledger.requeue(task, "recovered at start-up: its lane is gone")
        self.recovery_summary = summary
        log.info(
            "start-up reconciliation: %d resumed polling, %d re-queued, %d web stale, %d expired",
            summary["resume"],
            summary["requeue"],
            summary["stale"],
            summary["expire"],
        )

    def _live_numbers(self) -> dict[str, Any]:
        counters: dict[str, int] = {
            "dedup_hits": self.ledger.dedup_hits,
            "cache_hits": self.ledger.cache_hits,
            "retries": self.ledger.retries,
            "stale_reclaims": self.ledger.stale_reclaims,
            "stalled_reclaims": self.scheduler.stalled_reclaims,
        }
        remote: dict[tuple[str, str], int] = {}
        for runner in self.runners.values():
            stats = getattr(runner, "stats", None)
            if isinstance(stats, dict):
                for key, value in stats.items():
                    if key == "remote_requests" and isinstance(value, dict):
                        remote.update(value)
                    elif isinstance(value, int):
                        counters[key] = counters.get(key, 0) + value
        return {
            "state_counts": self.store.state_counts(),
            "lanes": self.scheduler.lanes_view(),
            "accounts": self.accounts.views(),
            "counters": counters,
            "remote_requests": remote,
            "event_loop_lag_s": self.lag_probe.max_lag_s(),
        }

    def metrics_payload(self) -> tuple[bytes, str]:
        return self.metrics.render()

    # -- stop ------------------------------------------------------------------
    async def stop(self) -> None:
        scheduler = getattr(self, "scheduler", None)
        if scheduler is not None:
            await scheduler.shutdown()
        webhooks = getattr(self, "webhooks", None)
        if webhooks is not None:
            await webhooks.aclose()
        self.events.close()
        if self.http is not None:
            await self.http.stop()
            self.http = None
            with contextlib.suppress(OSError):
                (self.state_dir / PORT_FILE).unlink()
        for runner in self.runners.values():
            with contextlib.suppress(Exception):
                await runner.aclose()
        self.runners.clear()
        for server in self.demo_servers:
            await server.stop()
        self.demo_servers.clear()
        await self.lag_probe.stop()
        store = getattr(self, "store", None)
        if store is not None:
            store.close()
            del self.store
        if self._lock is not None:
            self._lock.release()
            self._lock = None
        self._restore_umask()
        self._stopped.set()

    def _restore_umask(self) -> None:
        if self._umask is not None:
            os.umask(self._umask)
            self._umask = None

    async def serve_forever(self) -> None:
        """Run until SIGTERM or SIGINT, then shut down gracefully."""
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await self.start()
        try:
            await stop.wait()
            log.info("shutting down: running tasks stop at their checkpoints")
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
            await self.stop()
