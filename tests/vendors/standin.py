"""One small framework for the vendor stand-ins: every vendor on one loopback
server, each under ``/<vendor>/`` (its base URL), answering as its published
reference says (the answers themselves live in `tests.vendors.catalog_*`).

A job's life is counted in polls: the first answers the vendor's queued
state, the second its running state, the third its finished one (or its
failure, for a prompt with ``REFUSE`` on a vendor that refuses inside the
job). A prompt with ``HOLD`` stays running while `StandIn.hold` is set (a
restart test), and ``state.throttle[vendor] = n`` answers the next n
submits with the vendor's own 429 and Retry-After. Every request is kept
(`seen`), so a test can say what the dispatcher sent.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route

from demo.api_media import png_bytes
from dispatcher.service.serving import RunningServer, start_server

# The first bytes of an MP4 (an ftyp box), and enough after them to be a file.
MP4 = b"\x00\x00\x00\x18ftypmp42\x00\x00\x00\x00mp42isom" + b"\x00" * 512
PNG = png_bytes("a vendor stand-in")
KEY = "sk-standin-" + "5" * 24
# The variable each catalog profile reads its base URL from (`${NAME:-default}`),
# pointed at the stand-in: one table for the tests and `python -m tests.vendors`.
BASE_ENV = {
    "openai": "OPENAI_BASE_URL",
    "gemini": "GEMINI_BASE_URL",
    "runway": "RUNWAY_BASE_URL",
    "luma": "LUMA_BASE_URL",
    "replicate": "REPLICATE_BASE_URL",
    "fal": "FAL_QUEUE_URL",
    "kling": "KLING_BASE_URL",
    "minimax": "MINIMAX_BASE_URL",
    "dashscope": "DASHSCOPE_BASE_URL",
    "ark": "ARK_BASE_URL",
}


@dataclass
class Job:
    id: str
    prompt: str
    body: Any
    created: int
    polls: int = 0
    canceled: bool = False


@dataclass
class Seen:
    vendor: str
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes
    at: float  # monotonic seconds, when it arrived
    wall: float  # epoch seconds, when it arrived


@dataclass
class StandInState:
    hold: bool = True
    throttle: dict[str, int] = field(default_factory=dict)
    spent: set[str] = field(default_factory=set)  # vendors whose key's quota is spent
    # Rate-limit headers a vendor sends instead of its usual ones (remaining, reset).
    window: dict[str, tuple[str, str]] = field(default_factory=dict)
    jobs: dict[str, dict[str, Job]] = field(default_factory=dict)
    seen: list[Seen] = field(default_factory=list)
    ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def submits(self, vendor: str) -> int:
        return len(self.jobs.get(vendor, {}))


Handler = Callable[[Request], Awaitable[Response]]
# What a request about one job answers once its job is found.
Render = Callable[[Job], Response]


class Vendor:
    """A vendor's stand-in: its routes and its documented answers.

    Subclasses name `name` (the path prefix), `routes` and the answers;
    the base keeps the jobs, the phases and the bookkeeping."""

    name = ""
    refusal_at = "job"  # "submit" (a 4xx at once) or "job" (the job fails)
    retry_after_s = 1
    output: ClassVar[tuple[bytes, str]] = (MP4, "video/mp4")  # what a result URL serves

    def __init__(self, state: StandInState) -> None:
        self.state = state

    # -- what subclasses give ---------------------------------------------------
    def routes(self) -> list[BaseRoute]:
        raise NotImplementedError

    def authorized(self, request: Request) -> bool:
        return request.headers.get("authorization") == f"Bearer {KEY}"

    def unauthorized(self) -> Response:
        return JSONResponse({"error": "Unauthorized"}, status_code=401)

    def prompt_of(self, body: Any) -> str:
        return str(body.get("prompt", "")) if isinstance(body, dict) else ""

    def throttled(self) -> Response:
        return JSONResponse(
            {"error": "rate limited"},
            status_code=429,
            headers={"Retry-After": str(self.retry_after_s)},
        )

    def refused(self) -> Response:
        return JSONResponse({"error": "refused by moderation"}, status_code=400)

    def quota_spent(self) -> Response:
        return JSONResponse({"error": "insufficient credits"}, status_code=402)

    def job_missing(self) -> Response:
        return not_found()

    # -- shared -----------------------------------------------------------------
    def base(self, request: Request) -> str:
        return f"{request.url.scheme}://{request.url.netloc}/{self.name}"

    async def record(self, request: Request) -> bytes:
        body = await request.body()
        self.state.seen.append(
            Seen(
                self.name,
                request.method,
                request.url.path.removeprefix(f"/{self.name}"),
                request.url.query,
                {k.lower(): v for k, v in request.headers.items()},
                body,
                time.monotonic(),
                time.time(),
            )
        )
        return body

    async def read_json(self, request: Request) -> Any:
        raw = await self.record(request)
        if request.headers.get("content-type", "").startswith("multipart/form-data"):
            form = await request.form()
            data = {k: v for k, v in form.items() if isinstance(v, str)}
            files = [k for k, v in form.items() if not isinstance(v, str)]
            await form.close()
            return {**data, "__files__": files}
        return json.loads(raw) if raw else None

    async def gate(self, request: Request) -> Response | None:
        """Auth and throttling, before any job: None when the request may go on."""
        if not self.authorized(request):
            return self.unauthorized()
        if self.name in self.state.spent:
            return self.quota_spent()
        if self.state.throttle.get(self.name, 0) > 0:
            self.state.throttle[self.name] -= 1
            return self.throttled()
        return None

    async def submitted(self, request: Request, prefix: str) -> Job | Response:
        """A submit: its new job, or the answer refusing it (key, quota, throttle,
        a refusal the vendor gives at submit)."""
        body = await self.read_json(request)
        if (refusal := await self.gate(request)) is not None:
            return refusal
        if self.wants_refusal_now(self.prompt_of(body)):
            return self.refused()
        return self.new_job(body, prefix)

    async def answer(
        self, request: Request, render: Render, *, job_id: str | None = None, keyed: bool = True
    ) -> Response:
        """A request about one job: `render(job)`, or the vendor's answer to a
        wrong key or an unknown id. `keyed=False` where the vendor does not ask
        for the key (a signed output URL, these stand-ins' cancels)."""
        await self.record(request)
        if keyed and not self.authorized(request):
            return self.unauthorized()
        job = self.job(request.path_params["id"] if job_id is None else job_id)
        return self.job_missing() if job is None else render(job)

    async def file(self, request: Request) -> Response:
        await self.record(request)
        return media(*self.output)

    def new_job(self, body: Any, prefix: str = "") -> Job:
        number = next(self.state.ids)
        job = Job(f"{prefix}{number:06d}", self.prompt_of(body), body, 1_760_000_000 + number)
        self.state.jobs.setdefault(self.name, {})[job.id] = job
        return job

    def job(self, job_id: str) -> Job | None:
        return self.state.jobs.get(self.name, {}).get(job_id)

    def phase(self, job: Job, *, poll: bool = True) -> str:
        """queued, running, done, refused or canceled: the job's life in polls."""
        if poll:
            job.polls += 1
        if job.canceled:
            return "canceled"
        if "HOLD" in job.prompt and self.state.hold:
            return "running"
        if job.polls <= 1:
            return "queued"
        if job.polls == 2:
            return "running"
        if "REFUSE" in job.prompt and self.refusal_at == "job":
            return "refused"
        return "done"

    def wants_refusal_now(self, job_prompt: str) -> bool:
        return "REFUSE" in job_prompt and self.refusal_at == "submit"


def not_found(message: str = "not found") -> Response:
    return JSONResponse({"error": message}, status_code=404)


def cancel(job: Job, answer: Response) -> Response:
    """A cancel the vendor accepted: the job ends canceled at its next poll."""
    job.canceled = True
    return answer


def media(data: bytes, content_type: str) -> Response:
    return Response(data, media_type=content_type)


def build_app(vendors: list[Vendor]) -> Starlette:
    return Starlette(routes=[Mount(f"/{v.name}", routes=v.routes()) for v in vendors])


def route(path: str, handler: Handler, method: str = "GET") -> Route:
    return Route(path, handler, methods=[method])


async def start_standin(
    vendor_classes: list[type[Vendor]], port: int | None = None
) -> tuple[RunningServer, StandInState]:
    state = StandInState()
    vendors = [cls(state) for cls in vendor_classes]
    return await start_server(build_app(vendors), port), state
