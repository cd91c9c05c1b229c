"""Fixtures for the web runner tests: real Chromium against the demo web model.

Starting Chromium dominates these tests, so what can be shared is shared
across the session (one event loop): the demo site, one Playwright driver,
and one browser profile logged into the demo. Each test gets a fresh state
dir with its own copy of that profile, and a demo with counters and mode
reset. After each test, no Chromium may be left on any profile of the test.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import time
from collections.abc import AsyncIterator, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import pytest_asyncio
from playwright.async_api import Page, Playwright, async_playwright

from demo.web_model import demo_login, start_demo_web
from dispatcher.clock import SystemClock
from dispatcher.models import Kind, Stage, Task, new_id
from dispatcher.profiles import load_profiles
from dispatcher.scheduling.protocol import RunContext
from dispatcher.service.serving import RunningServer, start_server
from dispatcher.settings import Settings, find_browser
from tests.integration.webrunner.localsite import Site, site_app
from webrunner.profiledirs import user_data_dir_for
from webrunner.runner import WebRunner

SCALE = 0.05
PROFILES_DIR = Path("profiles")
LOGGER = "webrunner.test"
# Seconds an idle connection to the demo web server is kept (`web`).
KEEPALIVE_S = 2.0


class LaneLog(logging.LoggerAdapter):  # type: ignore[type-arg]
    """What the core hands a runner: a logger that prefixes the lane."""

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, Any]:
        return f"[{self.extra['lane']}] {msg}", kwargs  # type: ignore[index]


@dataclass
class Recorder:
    stages: list[tuple[Stage, float | None, int | None]] = field(default_factory=list)
    remote_ids: list[str] = field(default_factory=list)

    async def report_stage(
        self, stage: Stage, progress: float | None, queue_position: int | None
    ) -> None:
        self.stages.append((stage, progress, queue_position))

    async def record_remote_id(self, remote_id: str) -> None:
        self.remote_ids.append(remote_id)

    @property
    def stage_names(self) -> list[str]:
        return [stage.value for stage, _, _ in self.stages]

    async def wait_for_stage(self, stage: Stage, within_s: float = 60.0) -> None:
        deadline = time.monotonic() + within_s
        while stage not in (s for s, _, _ in self.stages):
            assert time.monotonic() < deadline, f"stage {stage} never reported: {self.stages}"
            await asyncio.sleep(0.02)


def browser_processes(root: Path) -> list[psutil.Process]:
    """Live processes whose --user-data-dir is `root` or below it."""
    prefix = os.path.realpath(root)
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        if proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        for arg in proc.info["cmdline"] or []:
            if arg.startswith("--user-data-dir="):
                value = os.path.realpath(arg.split("=", 1)[1])
                if value == prefix or value.startswith(prefix + os.sep):
                    found.append(proc)
    return found


def survivors(pids: list[int]) -> list[str]:
    """The processes among `pids` still running (a zombie has ended)."""
    alive = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            status = proc.status()
            if status != psutil.STATUS_ZOMBIE:
                alive.append(f"{pid} {status} ppid={proc.ppid()} {' '.join(proc.cmdline())[:120]}")
        except psutil.NoSuchProcess:
            continue
    return alive


@dataclass
class WebEnv:
    server: RunningServer
    driver: Playwright
    browser: str
    state_dir: Path
    http: httpx.AsyncClient
    template: Path
    runners: list[WebRunner] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.clock = SystemClock(SCALE)
        self.settings = Settings(
            state_dir=self.state_dir, browser_executable=self.browser, time_scale=SCALE
        )
        self.profiles = load_profiles(PROFILES_DIR, {"DEMO_WEB_URL": self.server.url})

    @property
    def url(self) -> str:
        return self.server.url

    def user_data_dir(self, account: str = "demo-1") -> Path:
        return user_data_dir_for(self.state_dir, account)

    def new_runner(self, **overrides: Any) -> WebRunner:
        settings = self.settings.model_copy(update=overrides) if overrides else self.settings
        runner = WebRunner(settings, self.profiles, self.clock, playwright=self.driver)
        self.runners.append(runner)
        return runner

    async def runner(self, **overrides: Any) -> WebRunner:
        runner = self.new_runner(**overrides)
        await runner.start()
        return runner

    def task(self, prompt: str, model: str = "demo-chat") -> Task:
        task_id = new_id()
        return Task(
            id=task_id,
            model=model,
            kind=Kind.WEB,
            queue=f"web:{model}",
            params={"prompt": prompt},
            fingerprint=f"fp-{task_id}",
            created_at=time.time(),
        )

    def context(
        self, task: Task, account: str = "demo-1", *, timeout_s: float | None = None
    ) -> tuple[RunContext, Recorder]:
        """The attempt's context; `timeout_s` (nominal) in place of its profile's."""
        recorder = Recorder()
        lane = f"web:{account}"
        profile = self.profiles[task.model]
        if timeout_s is not None and profile.web is not None:
            web = profile.web.model_copy(update={"timeout_s": timeout_s})
            profile = profile.model_copy(update={"web": web})
        ctx = RunContext(
            task=task,
            profile=profile,
            lane=lane,
            owner=account,
            clock=self.clock,
            result_dir=self.state_dir / "results" / task.id,
            log=LaneLog(logging.getLogger(LOGGER), {"lane": lane}),
            report_stage=recorder.report_stage,
            record_remote_id=recorder.record_remote_id,
        )
        return ctx, recorder

    async def stats(self) -> dict[str, Any]:
        response = await self.http.get("/__stats")
        response.raise_for_status()
        data: dict[str, Any] = response.json()
        return data

    async def set_mode(self, mode: str, **extra: Any) -> None:
        response = await self.http.post("/__mode", json={"mode": mode, **extra})
        response.raise_for_status()

    log_name = LOGGER

    @staticmethod
    def survivors(pids: list[int]) -> list[str]:
        return survivors(pids)

    def browser_pids(self, account: str = "demo-1") -> list[int]:
        return [p.pid for p in browser_processes(self.user_data_dir(account))]

    def unknown_browser_pids(self, runner: WebRunner, account: str = "demo-1") -> list[int]:
        """The account's browser processes other than the runner's open browser's family."""
        known: set[int] = set()
        pid = runner.open_browsers().get(account)
        if pid is not None:
            with contextlib.suppress(psutil.Error):
                main = psutil.Process(pid)
                known = {pid, *(child.pid for child in main.children(recursive=True))}
        return [p for p in self.browser_pids(account) if p not in known]


@pytest.fixture(scope="session")
def browser_path() -> str:
    found = find_browser()
    if not found:
        pytest.skip("no Chromium on this machine")
    return found


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def demo_web() -> AsyncIterator[RunningServer]:
    server = await start_demo_web(time_scale=SCALE)
    yield server
    await server.stop()


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def driver() -> AsyncIterator[Playwright]:
    playwright = await async_playwright().start()
    yield playwright
    await playwright.stop()


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def logged_in_profile(
    tmp_path_factory: pytest.TempPathFactory,
    demo_web: RunningServer,
    driver: Playwright,
    browser_path: str,
) -> Path:
    """A browser profile logged into the demo once; tests copy it."""
    profile = tmp_path_factory.mktemp("template") / "profile"
    assert await demo_login(browser_path, profile, f"{demo_web.url}/chat", playwright=driver)
    assert not browser_processes(profile)
    return profile


@pytest_asyncio.fixture(loop_scope="session")
async def web(
    tmp_path: Path,
    demo_web: RunningServer,
    driver: Playwright,
    logged_in_profile: Path,
    browser_path: str,
) -> AsyncIterator[WebEnv]:
    state_dir = tmp_path / "state"
    target = user_data_dir_for(state_dir, "demo-1")
    target.parent.mkdir(parents=True, mode=0o700)
    shutil.copytree(
        logged_in_profile, target, symlinks=True, ignore=shutil.ignore_patterns("Singleton*")
    )
    # An idle connection is dropped well before the demo server's keep-alive
    # (uvicorn's 5 s): at httpx's own 5 s, a request on one idle that long
    # could meet the server's close (`ReadError`, a test that waited ~5 s).
    limits = httpx.Limits(keepalive_expiry=KEEPALIVE_S)
    async with httpx.AsyncClient(base_url=demo_web.url, limits=limits) as http:
        (await http.post("/__reset")).raise_for_status()
        env = WebEnv(
            server=demo_web,
            driver=driver,
            browser=browser_path,
            state_dir=state_dir,
            http=http,
            template=logged_in_profile,
        )
        try:
            yield env
        finally:
            for runner in env.runners:
                await runner.aclose()
            (await http.post("/__reset")).raise_for_status()
    leftovers = browser_processes(state_dir)
    for proc in leftovers:
        proc.kill()
    assert not leftovers, f"Chromium left running on the test's profiles: {leftovers}"


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def site() -> AsyncIterator[Site]:
    pages: dict[str, str] = {}
    server = await start_server(site_app(pages))
    try:
        yield Site(server, pages)
    finally:
        await server.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def page(driver: Playwright, browser_path: str) -> AsyncIterator[Page]:
    """A tab of a bare Chromium (no runner, no profile) that a module's
    tests write their pages into (`set_content`)."""
    browser = await driver.chromium.launch(executable_path=browser_path, args=["--no-sandbox"])
    try:
        yield await browser.new_page()
    finally:
        await browser.close()
