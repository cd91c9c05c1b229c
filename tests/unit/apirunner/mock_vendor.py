"""A provider inside the test process, behind `httpx.MockTransport`, and the
`ApiRunner` wired to it: the runner's decisions without a demo process.

The vendor answers from a script per (method, URL): each request takes the
next answer, and the last one repeats. Every request is recorded with the
fake clock's time, so a test can read what was sent, in which order, when.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from apirunner.runner import ApiRunner
from dispatcher.clock import FakeClock
from dispatcher.models import Kind, Stage, Task, new_id
from dispatcher.profiles import Profile
from dispatcher.scheduling.protocol import RunContext, RunResult
from dispatcher.settings import Settings

HOME = "http://vendor.test"
CDN = "http://cdn.test"  # allowlisted: a second profile names it
FOREIGN = "http://elsewhere.test"  # named by no profile
KEY = "sk-mock-0123456789"

Answer = Callable[[httpx.Request], httpx.Response]


def answer(status: int = 200, body: Any = None, **headers: str) -> Answer:
    """A JSON answer (or bytes / text as they are), built fresh for each request."""

    def build(_: httpx.Request) -> httpx.Response:
        if isinstance(body, bytes):
            return httpx.Response(status, content=body, headers=headers)
        if isinstance(body, str):
            return httpx.Response(status, text=body, headers=headers)
        return httpx.Response(status, json=body, headers=headers)

    return build


def redirect(location: str, status: int = 302) -> Answer:
    return answer(status, b"", location=location)


@dataclass
class Sent:
    method: str
    url: str
    headers: httpx.Headers
    body: bytes
    at_s: float  # the fake clock's monotonic time


@dataclass
class Vendor:
    clock: FakeClock
    script: dict[tuple[str, str], list[Answer]] = field(default_factory=dict)
    sent: list[Sent] = field(default_factory=list)

    def on(self, method: str, url: str, *answers: Answer) -> None:
        self.script[(method, url)] = list(answers)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        url = str(request.url)
        self.sent.append(
            Sent(request.method, url, request.headers, request.read(), self.clock.monotonic())
        )
        answers = self.script.get((request.method, url))
        if not answers:
            return httpx.Response(404, json={"error": {"message": f"no route {url}"}})
        reply = answers.pop(0) if len(answers) > 1 else answers[0]
        return reply(request)

    def to(self, method: str, url: str) -> list[Sent]:
        return [s for s in self.sent if (s.method, s.url) == (method, url)]


def job_profile() -> Profile:
    """An OpenAI-videos-like async job: submit, poll by id, download, cancel."""
    return Profile.model_validate(
        {
            "name": "mock-video",
            "kind": "api",
            "provider": "vendor",
            "api": {
                "base_url": HOME,
                "auth_header": "Authorization",
                "auth_env": "MOCK_VENDOR_KEY",
                "auth_prefix": "Bearer ",
                "style": "async-job",
                "timeout_s": 600,
                "submit": {
                    "method": "POST",
                    "path": "/v1/videos",
                    "body": {"prompt": "{prompt}"},
                    "id": "id",
                },
                "status": {
                    "path": "/v1/videos/{id}",
                    "state": "status",
                    "progress": "progress",
                    "error": "error.message",
                    "map": {
                        "queued": "pending",
                        "in_progress": "running",
                        "completed": "success",
                        "failed": "failed",
                    },
                },
                "result": {"path": "/v1/videos/{id}/content"},
                "cancel": {"method": "POST", "path": "/v1/videos/{id}/cancel"},
            },
        }
    )


def cdn_profile() -> Profile:
    """Another provider's chat model: it only puts the CDN's host on the allowlist."""
    return Profile.model_validate(
        {
            "name": "mock-cdn-chat",
            "kind": "api",
            "provider": "cdn",
            "api": {
                "base_url": CDN,
                "style": "chat",
                "submit": {"method": "POST", "path": "/chat"},
                "result": {"text": "text"},
            },
        }
    )


SUBMIT = ("POST", f"{HOME}/v1/videos")


def status_url(job_id: str) -> str:
    return f"{HOME}/v1/videos/{job_id}"


def content_url(job_id: str) -> str:
    return f"{HOME}/v1/videos/{job_id}/content"


def cancel_url(job_id: str) -> str:
    return f"{HOME}/v1/videos/{job_id}/cancel"


@dataclass
class Reports:
    """What the runner told its RunContext, in order."""

    remote_ids: list[str] = field(default_factory=list)
    events: list[str] = field(default_factory=list)

    async def stage(self, stage: Stage, progress: float | None, position: int | None) -> None:
        self.events.append(f"stage:{stage.value}")

    async def remote_id(self, remote_id: str) -> None:
        self.remote_ids.append(remote_id)
        self.events.append("remote_id")


@dataclass
class Bench:
    vendor: Vendor
    runner: ApiRunner
    profile: Profile
    clock: FakeClock
    result_dir: Path

    def task(self, prompt: str = "a cat", **changes: Any) -> Task:
        task = Task(
            id=new_id(),
            model=self.profile.name,
            kind=Kind.API,
            queue=self.profile.queue,
            params={"prompt": prompt},
            fingerprint=new_id(),
            created_at=self.clock.now(),
            owner="vendor",
        )
        return task.replace(**changes) if changes else task

    def ctx(self, task: Task) -> tuple[RunContext, Reports]:
        reports = Reports()
        ctx = RunContext(
            task=task,
            profile=self.profile,
            lane="api:vendor",
            owner="vendor",
            clock=self.clock,
            result_dir=self.result_dir / task.id,
            log=logging.LoggerAdapter(logging.getLogger("test.mock_vendor"), {"task": task.id}),
            report_stage=reports.stage,
            record_remote_id=reports.remote_id,
        )
        return ctx, reports

    async def run(self, task: Task | None = None) -> tuple[RunResult, Reports]:
        task = task or self.task()
        ctx, reports = self.ctx(task)
        return await self.runner.run(task, ctx), reports


@asynccontextmanager
async def bench(tmp_path: Path) -> AsyncIterator[Bench]:
    """The runner over the mock vendor; jitter fixed, time on a fake clock."""
    clock = FakeClock()
    vendor = Vendor(clock)
    profile = job_profile()
    profiles = {profile.name: profile, "mock-cdn-chat": cdn_profile()}
    settings = Settings(state_dir=tmp_path / "state", http_timeout_s=5.0)
    runner = ApiRunner(
        settings,
        profiles,
        clock,
        {"vendor": 2, "cdn": 1},
        rand=lambda: 0.5,
        transport=httpx.MockTransport(vendor),
    )
    await runner.start()
    try:
        yield Bench(vendor, runner, profile, clock, tmp_path / "results")
    finally:
        await runner.aclose()
