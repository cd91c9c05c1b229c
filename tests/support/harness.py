"""A real service on a free loopback port, driven over HTTP, for integration tests."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator, Iterable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from dispatcher.service.core import Service
from dispatcher.settings import Settings
from tests.support.demologin import TemplatedDemo
from tests.support.helpers import REPO

API_PROFILES = ("demo-chat-api", "demo-video", "demo-queue")
WEB_PROFILES = ("demo-chat", "demo-reasoner")
TERMINAL = {"success", "failed", "canceled"}


def awaiting(task: asyncio.Task[Any]) -> list[str]:
    """What `task` waits on, outermost first: each coroutine's file:line down
    its chain of awaits (`Task.get_stack` gives only the outermost frame)."""
    chain: list[str] = []
    link: Any = task.get_coro()
    while link is not None:
        frame = getattr(link, "cr_frame", None) or getattr(link, "gi_frame", None)
        if frame is None:
            chain.append(repr(link)[:200])  # a future, or a finished coroutine
            break
        code = frame.f_code
        chain.append(f"{code.co_filename.rsplit('/', 2)[-1]}:{frame.f_lineno} {code.co_name}")
        link = getattr(link, "cr_await", None) or getattr(link, "gi_yieldfrom", None)
    return chain


@dataclass
class Harness:
    service: Service
    http: httpx.AsyncClient
    state_dir: Path

    @property
    def demo_api(self) -> str:
        return self.service.demo_urls["DEMO_API_URL"]

    @property
    def demo_web(self) -> str:
        return self.service.demo_urls["DEMO_WEB_URL"]

    @property
    def demo_comfy(self) -> str:
        return self.service.demo_urls["DEMO_COMFY_URL"]

    async def submit(self, model: str, prompt: str, **params: Any) -> dict[str, Any]:
        force = params.pop("force", False)
        response = await self.http.post(
            "/v1/tasks",
            json={"model": model, "params": {"prompt": prompt, **params}, "force": force},
        )
        assert response.status_code in (200, 201), response.text
        return dict(response.json())

    async def job(self, name: str, tasks: list[dict[str, Any]]) -> dict[str, Any]:
        response = await self.http.post("/v1/jobs", json={"name": name, "tasks": tasks})
        assert response.status_code == 201, response.text
        return dict(response.json())

    async def task(self, task_id: str) -> dict[str, Any]:
        response = await self.http.get(f"/v1/tasks/{task_id}")
        assert response.status_code == 200, response.text
        return dict(response.json())

    async def wait_task(
        self, task_id: str, states: Iterable[str] = TERMINAL, timeout_s: float = 30.0
    ) -> dict[str, Any]:
        wanted = set(states)
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            task = await self.task(task_id)
            if task["state"] in wanted:
                return task
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"task {task_id} stuck in {task['state']}: {task}")
            await asyncio.sleep(0.02)

    async def wait_remote_id(self, task_id: str, timeout_s: float = 30.0) -> dict[str, Any]:
        """The task once its remote job exists (its id is stored before anything else)."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            task = await self.task(task_id)
            if task["remote_id"]:
                return task
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"task {task_id} never got a remote id: {task}")
            await asyncio.sleep(0.02)

    async def wait_job(self, job_id: str, timeout_s: float = 60.0) -> dict[str, Any]:
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            response = await self.http.get(f"/v1/jobs/{job_id}")
            job = dict(response.json())
            if job["state"] != "running":
                return job
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"job {job_id} still running: {job['counts']}")
            await asyncio.sleep(0.05)

    async def accounts(self) -> dict[str, dict[str, Any]]:
        """`GET /v1/accounts`, by name."""
        response = await self.http.get("/v1/accounts")
        assert response.status_code == 200, response.text
        return {a["name"]: a for a in response.json()}

    async def wait_account(self, name: str, state: str, timeout_s: float = 60.0) -> dict[str, Any]:
        """The account (or provider) once its visible state is `state`."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while (account := (await self.accounts())[name])["state"] != state:
            assert asyncio.get_running_loop().time() < deadline, f"{name} stuck in {account}"
            await asyncio.sleep(0.02)
        return account

    async def browsers_started(self, timeout_s: float = 60.0) -> None:
        """Until the web accounts' browsers started as their lanes opened are
        up (`dispatcher.accounts.warmup`): a test that changes the demo site's state
        (a logout, a cap) after the start means its task to meet the change,
        not a start still under way in the background."""
        prewarm = self.service.prewarm
        deadline = asyncio.get_running_loop().time() + timeout_s
        while prewarm is not None and prewarm.starting:
            if asyncio.get_running_loop().time() > deadline:
                # Where each start waits: a start past the wait is a hang to find.
                jobs: dict[str, asyncio.Task[None]] = getattr(prewarm, "_jobs", {})
                where = {account: awaiting(job) for account, job in jobs.items()}
                raise AssertionError(f"browsers still starting after {timeout_s:.0f} s: {where}")
            await asyncio.sleep(0.02)

    async def demo_stats(self, base: str | None = None) -> dict[str, Any]:
        async with httpx.AsyncClient() as client:
            response = await client.get(f"{base or self.demo_api}/__stats")
        return dict(response.json())

    async def demo_mode(self, mode: dict[str, Any], base: str | None = None) -> None:
        async with httpx.AsyncClient() as client:
            response = await client.post(f"{base or self.demo_api}/__mode", json=mode)
            response.raise_for_status()


def profiles_dir(tmp_path: Path, names: Iterable[str]) -> Path:
    target = tmp_path / "profiles"
    target.mkdir(exist_ok=True)
    for name in names:
        shutil.copy(REPO / "profiles" / f"{name}.toml", target / f"{name}.toml")
    # ComfyUI profiles name their workflow relative to the profile file.
    shutil.copytree(REPO / "profiles" / "workflows", target / "workflows", dirs_exist_ok=True)
    return target


@asynccontextmanager
async def running_service(
    tmp_path: Path,
    *,
    profiles: Iterable[str] = API_PROFILES,
    time_scale: float = 0.02,
    state_dir: Path | None = None,
    **overrides: Any,
) -> AsyncIterator[Harness]:
    settings = Settings(
        state_dir=state_dir or tmp_path / "state",
        profiles_dir=profiles_dir(tmp_path, profiles),
        time_scale=time_scale,
        demo=True,
        **overrides,
    )
    async with serving(settings) as harness:
        yield harness


def host_service(
    tmp_path: Path,
    host_id: str,
    profiles: Iterable[str],
    database_url: str,
    time_scale: float,
    **overrides: Any,
) -> AbstractAsyncContextManager[Harness]:
    """One of several hosts on a shared database: its own dir under `tmp_path`."""
    (tmp_path / host_id).mkdir(exist_ok=True)
    return running_service(
        tmp_path / host_id,
        profiles=profiles,
        time_scale=time_scale,
        database_url=database_url,
        host_id=host_id,
        **overrides,
    )


@asynccontextmanager
async def serving(settings: Settings) -> AsyncIterator[Harness]:
    """The service started in process with `settings`, and a client holding its token.

    The demo's web accounts come logged in from profiles logged in once per
    test process (`tests.support.demologin`), not by a browser of their own
    at every start."""
    async with (
        Service(settings, demo=TemplatedDemo()) as service,
        httpx.AsyncClient(
            base_url=service.url,
            headers={"Authorization": f"Bearer {service.credentials.token}"},
            timeout=30,
        ) as http,
    ):
        yield Harness(service=service, http=http, state_dir=settings.state_dir)
