"""Fixtures for runner-level tests: the demo provider on a real socket, the
bundled profiles pointed at it, and hand-built RunContexts that record what
the runner reported."""

from __future__ import annotations

import asyncio
import logging
import shutil
import subprocess
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from apirunner.runner import ApiRunner
from demo.api_provider import start_demo_api
from dispatcher.clock import SystemClock
from dispatcher.models import Kind, Stage, Task, new_id
from dispatcher.profiles import Profile, load_profiles
from dispatcher.scheduling.protocol import RunContext, RunResult
from dispatcher.service.serving import RunningServer
from dispatcher.settings import Settings

SCALE = 0.02
PROFILES_DIR = Path(__file__).resolve().parents[3] / "profiles"


@dataclass
class Recorder:
    """What one RunContext was told: stages and the remote id, in order."""

    stages: list[tuple[Stage, float | None, int | None]] = field(default_factory=list)
    remote_ids: list[str] = field(default_factory=list)
    events: list[str] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    async def wait_for(self, condition: Callable[[Recorder], bool]) -> None:
        async with asyncio.timeout(5):
            while not condition(self):
                self.changed.clear()
                await self.changed.wait()

    async def report_stage(
        self, stage: Stage, progress: float | None, queue_position: int | None
    ) -> None:
        self.stages.append((stage, progress, queue_position))
        self.events.append(f"stage:{stage.value}")
        self.changed.set()

    async def record_remote_id(self, remote_id: str) -> None:
        self.remote_ids.append(remote_id)
        self.events.append("remote_id")
        self.changed.set()


@dataclass
class Demo:
    server: RunningServer
    http: httpx.AsyncClient

    @property
    def url(self) -> str:
        return self.server.url

    async def stats(self) -> dict[str, Any]:
        answer = await self.http.get(f"{self.url}/__stats")
        answer.raise_for_status()
        data: dict[str, Any] = answer.json()
        return data

    async def mode(self, **body: Any) -> None:
        answer = await self.http.post(f"{self.url}/__mode", json=body)
        answer.raise_for_status()


@pytest.fixture
def api_key(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setenv("DEMO_API_KEY", "test-key")
    yield "test-key"


@pytest.fixture
async def demo(api_key: str) -> AsyncIterator[Demo]:
    server = await start_demo_api(time_scale=SCALE, quota=3)
    async with httpx.AsyncClient(timeout=10, verify=False) as http:
        try:
            yield Demo(server, http)
        finally:
            await server.stop()


@pytest.fixture
def clock() -> SystemClock:
    return SystemClock(time_scale=SCALE)


@pytest.fixture
def profiles(demo: Demo) -> dict[str, Profile]:
    return load_profiles(PROFILES_DIR, {"DEMO_API_URL": demo.url})


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(state_dir=tmp_path / "state", http_timeout_s=10.0, time_scale=SCALE)


@pytest.fixture
async def runner(
    settings: Settings, profiles: dict[str, Profile], clock: SystemClock
) -> AsyncIterator[ApiRunner]:
    api = {name: p for name, p in profiles.items() if p.kind is Kind.API}
    concurrency = {p.provider: 3 for p in api.values() if p.provider}
    runner = ApiRunner(settings, api, clock, concurrency)
    await runner.start()
    try:
        yield runner
    finally:
        await runner.aclose()


@dataclass
class Kit:
    """Builds tasks and contexts the way the scheduler would, by hand."""

    demo: Demo
    runner: ApiRunner
    profiles: dict[str, Profile]
    clock: SystemClock
    result_dir: Path

    def task(self, model: str, params: dict[str, Any], **changes: Any) -> Task:
        profile = self.profiles[model]
        task = Task(
            id=new_id(),
            model=profile.name,
            kind=Kind.API,
            queue=profile.queue,
            params=params,
            fingerprint=new_id(),
            created_at=0.0,
            owner=profile.provider,
        )
        return task.replace(**changes) if changes else task

    def ctx(self, task: Task, profile: Profile | None = None) -> tuple[RunContext, Recorder]:
        profile = profile or self.profiles[task.model]
        recorder = Recorder()
        ctx = RunContext(
            task=task,
            profile=profile,
            lane=f"api:{profile.provider}",
            owner=profile.provider or "",
            clock=self.clock,
            result_dir=self.result_dir / task.id,
            log=logging.LoggerAdapter(logging.getLogger("test.apirunner"), {"task": task.id}),
            report_stage=recorder.report_stage,
            record_remote_id=recorder.record_remote_id,
        )
        return ctx, recorder

    async def run(self, task: Task) -> tuple[RunResult, Recorder]:
        ctx, recorder = self.ctx(task)
        return await self.runner.run(task, ctx), recorder


@pytest.fixture
def kit(
    demo: Demo,
    runner: ApiRunner,
    profiles: dict[str, Profile],
    clock: SystemClock,
    tmp_path: Path,
) -> Kit:
    return Kit(demo, runner, profiles, clock, tmp_path / "results")


@pytest.fixture(scope="session")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate and its key for localhost and 127.0.0.1,
    made by the openssl command: TLS servers of the tests trust it."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("the openssl command is not installed: no certificate for the TLS server")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [
            *(openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-keyout", str(key), "-out", str(cert), "-subj", "/CN=localhost"),
            *("-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key
