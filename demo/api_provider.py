"""A local demo API provider that behaves like the real vendors.

Two vendors on one server, each with its own quota and Retry-After per API
key, as separate companies would have:

- ``openai``: chat (``POST /v1/chat/completions``) and OpenAI-videos-like
  async jobs (``/v1/videos``: submit, status, ``/content``, ``/cancel``).
- ``fal``: a fal-queue-like API (``POST /fal/<app>`` answers absolute
  ``status_url`` / ``response_url`` / ``cancel_url``; the result names a
  downloadable image URL).

Like the real ones it wants an API key (any non-empty ``Bearer``/``Key``),
answers 429 with ``Retry-After`` (or ``retry-after-ms``) when a key would
exceed its concurrency quota, dedupes ``Idempotency-Key`` replays, and fails
on demand: ``POST /__mode`` (storms of 429/5xx, slow answers, dropped
connections, failing jobs) or per prompt (``[fail=permanent]``,
``[fail=transient]``, ``[status=400]``, ``[duration=2]``). ``GET /__stats``
shows what it saw, ``GET /__jobs`` when each job ends (wall clock);
``POST /__reset`` forgets everything. Generation times are
nominal seconds times `time_scale`; Retry-After values are real time.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import time
import uuid
from collections import Counter
from dataclasses import asdict
from email.utils import formatdate
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from demo.api_faults import Fault, FaultPlan, FrontDoor
from demo.api_files import Files
from demo.api_media import png_bytes, video_bytes
from demo.api_protocol import (
    DIRECTIVE,
    FAL,
    OPENAI,
    PERMANENT_REASON,
    TRANSIENT_REASON,
    api_key,
    directives,
    error_response,
    nominal_duration,
    parse_seconds,
)
from demo.api_records import Job, Stats
from dispatcher.service.serving import RunningServer, start_server

__all__ = ["DemoProvider", "create_app", "png_bytes", "start_demo_api", "video_bytes"]

DEFAULT_JOB_S = 3.0
DEFAULT_CHAT_S = 1.0
QUEUE_SHARE = 0.2  # the first fifth of a job is spent queued
# A request that was already on its way when we sent a 429 could not have
# known about it; only requests arriving later than this count as early. It
# is generous because in tests one loaded event loop serves both ends, and a
# request sent before the 429 was read can reach us a few hundred ms later.
IN_FLIGHT_GRACE_S = 0.5


class DemoProvider:
    def __init__(self, time_scale: float = 1.0, quota: int = 3) -> None:
        if time_scale <= 0 or quota < 1:
            raise ValueError("time_scale must be > 0 and quota >= 1")
        self.time_scale = time_scale
        self.quota = quota
        self.reset()

    def reset(self) -> None:
        self.stats = Stats()
        self.files = Files()
        self.jobs: dict[str, Job] = {}
        self.idempotency: dict[tuple[str, str, str], str] = {}
        self.chat_answers: dict[tuple[str, str], dict[str, Any]] = {}
        self.chats_in_flight: Counter[tuple[str, str]] = Counter()
        # (key, vendor) -> [(when the 429 was sent, until when), ...]
        self.deadlines: dict[tuple[str, str], list[tuple[float, float]]] = {}
        self.plan = FaultPlan()  # what POST /__mode asked for

    # -- bookkeeping ---------------------------------------------------------
    def running_jobs(self, key: str, vendor: str, now: float) -> list[Job]:
        return [
            j
            for j in self.jobs.values()
            if j.key == key and j.vendor == vendor and j.phase(now) in ("queued", "in_progress")
        ]

    def admit(self, key: str, vendor: str) -> JSONResponse | None:
        """None when the key may start one more generation, else the 429."""
        now = time.monotonic()
        running = self.running_jobs(key, vendor, now)
        active = len(running) + self.chats_in_flight[(key, vendor)]
        self.stats.max_demanded = max(self.stats.max_demanded, active + 1)
        if active >= self.quota:
            # Like real vendors, say when a slot frees up: the earliest end.
            ends = [j.ends for j in running]
            wait = max(0.05, min(ends) - now) if ends else 0.5
            return self.too_many(key, vendor, wait, "both", f"concurrency quota of {self.quota}")
        self.stats.max_concurrent = max(self.stats.max_concurrent, active + 1)
        by_vendor = self.stats.max_concurrent_by_vendor
        by_vendor[vendor] = max(by_vendor.get(vendor, 0), active + 1)
        return None

    def too_many(
        self, key: str | None, vendor: str, wait_s: float, header: str, why: str
    ) -> JSONResponse:
        self.stats.rate_limited += 1
        return self.refuse(429, key, vendor, wait_s, header, f"rate limited: {why}")

    def refuse(
        self, status: int, key: str | None, vendor: str, wait_s: float, header: str, message: str
    ) -> JSONResponse:
        """An error answer carrying a Retry-After, remembered to spot early requests."""
        now, wall = time.monotonic(), time.time()
        headers: dict[str, str] = {}
        if header == "none":  # a bare 429, as a storm from an overloaded edge sends
            until = now
        elif header in ("ms", "both"):
            millis = max(1, math.ceil(wait_s * 1000))
            headers["retry-after-ms"] = str(millis)
            until = now + millis / 1000
            if header == "both":
                headers["Retry-After"] = str(max(1, math.ceil(wait_s)))
        elif header == "date":
            at = math.ceil(wall + wait_s)
            headers["Retry-After"] = formatdate(at, usegmt=True)
            until = now + (at - wall)
        else:
            seconds = max(1, math.ceil(wait_s))
            headers["Retry-After"] = str(seconds)
            until = now + seconds
        if key is not None:
            self.deadlines.setdefault((key, vendor), []).append((now, until))
        code = "rate_limit_exceeded" if status == 429 else "server_error"
        body = {"error": {"message": message, "type": code, "code": code}}
        return JSONResponse(body, status, headers=headers)

    def note_arrival(self, key: str | None, vendor: str) -> None:
        if key is None:
            return
        now = time.monotonic()
        entries = [(s, u) for s, u in self.deadlines.get((key, vendor), []) if u > now]
        self.deadlines[(key, vendor)] = entries
        broken = [(sent, until) for sent, until in entries if sent + IN_FLIGHT_GRACE_S <= now]
        if broken:
            self.stats.early_requests += 1
            sent, until = max(broken, key=lambda e: e[1])
            # How early, and how long after the 429 it told us to wait: for debugging.
            self.stats.early_log.append(
                {"early_by_s": round(until - now, 4), "after_429_s": round(now - sent, 4)}
            )
            del self.stats.early_log[:-20]

    def take_fault(self, op: str) -> Fault | None:
        fault = self.plan.take(op)
        if fault is not None:
            self.stats.faults += 1
        return fault

    def new_job(self, vendor: str, key: str, body: dict[str, Any], prompt: str) -> Job:
        marks = directives(prompt)
        total = nominal_duration(marks, body, DEFAULT_JOB_S) * self.time_scale
        reason: str | None
        if marks.get("fail") == "permanent":
            reason = PERMANENT_REASON
        elif marks.get("fail") == "transient":
            reason = TRANSIENT_REASON
        else:
            reason = self.plan.next_job_failure()
        prefix = "video_" if vendor == OPENAI else ""
        job = Job(
            id=prefix + uuid.uuid4().hex,
            vendor=vendor,
            key=key,
            prompt=prompt,
            model=str(body.get("model", "")),
            created=time.monotonic(),
            queue_s=total * QUEUE_SHARE,
            run_s=total * (1 - QUEUE_SHARE),
            fail_reason=reason,
            seconds=str(body.get("seconds", "4")),
        )
        self.jobs[job.id] = job
        self.stats.jobs_created += 1
        return job

    def queue_position(self, job: Job, now: float) -> int:
        return sum(
            1
            for j in self.jobs.values()
            if j.vendor == job.vendor and j.created < job.created and j.phase(now) == "queued"
        )

    def video_json(self, job: Job) -> dict[str, Any]:
        now = time.monotonic()
        phase = job.phase(now)
        return {
            "id": job.id,
            "object": "video",
            "model": job.model,
            "status": phase,
            "progress": job.progress(now),
            "seconds": job.seconds,
            "prompt": job.prompt,
            "error": {"code": "generation_failed", "message": job.fail_reason}
            if phase == "failed"
            else None,
        }

    # -- submits shared by both vendors ----------------------------------------
    async def submit(self, request: Request, vendor: str) -> tuple[Job | None, Response | None]:
        key = api_key(request.headers) or ""
        self.stats.submits += 1
        body, images, refusal = await self.files.read_submit(request)
        if refusal is not None:
            return None, refusal
        if not isinstance(body, dict):
            return None, error_response(400, "the body must be a JSON object")
        prompt = body.get("prompt")
        if not isinstance(prompt, str) or not prompt.strip():
            return None, error_response(400, "`prompt` is required and must be a non-empty string")
        if "gen_s" in body and parse_seconds(body["gen_s"]) is None:
            return None, error_response(400, "`gen_s` must be a non-negative number")
        forced = directives(prompt).get("status", "")
        if forced.isdigit() and int(forced) >= 400:
            return None, error_response(int(forced), f"forced status {forced} by the prompt")
        idem = request.headers.get("idempotency-key")
        if idem and (key, vendor, idem) in self.idempotency:
            self.stats.duplicate_submits += 1
            return self.jobs[self.idempotency[(key, vendor, idem)]], None
        refusal = self.admit(key, vendor)
        if refusal is not None:
            return None, refusal
        job = self.new_job(vendor, key, body, prompt)
        if images:
            self.stats.reference_hashes[job.id] = images
        if idem:
            self.idempotency[(key, vendor, idem)] = job.id
        return job, None

    def job_or_404(self, job_id: str, key: str, vendor: str) -> Job | JSONResponse:
        job = self.jobs.get(job_id)
        if job is None or job.key != key or job.vendor != vendor:
            return error_response(404, f"no job {job_id!r}", "not_found")
        return job

    async def generate(self, request: Request, seconds: float) -> bool:
        """Take `seconds` to answer; False when the client hung up first, which
        stops the generation (and frees the quota) as real providers do."""
        if seconds <= 0:
            # An instant answer has no "before" to hang up in; racing one costs
            # two tasks per request, which the instant benchmarks pay for.
            return True

        async def hangup() -> None:
            while (await request.receive())["type"] != "http.disconnect":
                pass

        work = asyncio.ensure_future(asyncio.sleep(seconds))
        listener = asyncio.ensure_future(hangup())
        both: set[asyncio.Future[None]] = {work, listener}
        try:
            await asyncio.wait(both, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for future in both:
                future.cancel()
            await asyncio.wait(both)
        return work.done() and not work.cancelled()

    # -- OpenAI-compatible chat --------------------------------------------------
    async def chat(self, request: Request) -> Response:
        key = api_key(request.headers) or ""
        self.stats.submits += 1
        try:
            body = await request.json()
        except ValueError:
            return error_response(400, "the body is not JSON")
        messages = body.get("messages") if isinstance(body, dict) else None
        last = messages[-1] if isinstance(messages, list) and messages else None
        content = last.get("content") if isinstance(last, dict) else None
        if not isinstance(content, str):
            return error_response(
                400, "`messages` must end with a message whose `content` is a string"
            )
        marks = directives(content)
        forced = marks.get("status", "")
        if forced.isdigit() and int(forced) >= 400:
            return error_response(int(forced), f"forced status {forced} by the prompt")
        idem = request.headers.get("idempotency-key")
        if idem and (key, idem) in self.chat_answers:
            self.stats.duplicate_submits += 1
            return JSONResponse(self.chat_answers[(key, idem)])
        refusal = self.admit(key, OPENAI)
        if refusal is not None:
            return refusal
        self.chats_in_flight[(key, OPENAI)] += 1
        try:
            seconds = nominal_duration(marks, body, DEFAULT_CHAT_S) * self.time_scale
            if not await self.generate(request, seconds):
                self.stats.hangups += 1
                return Response(status_code=499)  # nobody is listening any more
        finally:
            self.chats_in_flight[(key, OPENAI)] -= 1
        if marks.get("fail") == "permanent":
            return error_response(400, PERMANENT_REASON, "content_policy_violation")
        if marks.get("fail") == "transient":
            return error_response(500, TRANSIENT_REASON, "server_error")
        text = DIRECTIVE.sub("", content).strip()
        answer = {
            "id": "chatcmpl-" + uuid.uuid4().hex,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": str(body.get("model", "demo-chat")),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": f"echo: {text}"},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": len(text.split()), "completion_tokens": 1 + len(text)},
        }
        if idem:
            self.chat_answers[(key, idem)] = answer
        self.stats.chat_completions += 1
        return JSONResponse(answer)

    # -- OpenAI-videos-like -------------------------------------------------------
    async def video_create(self, request: Request) -> Response:
        job, refusal = await self.submit(request, OPENAI)
        return refusal or JSONResponse(self.video_json(job) if job else {})

    async def video_get(self, request: Request) -> Response:
        self.stats.polls += 1
        found = self.job_or_404(request.path_params["vid"], api_key(request.headers) or "", OPENAI)
        return found if isinstance(found, Response) else JSONResponse(self.video_json(found))

    async def video_content(self, request: Request) -> Response:
        self.stats.downloads += 1
        found = self.job_or_404(request.path_params["vid"], api_key(request.headers) or "", OPENAI)
        if isinstance(found, Response):
            return found
        phase = found.phase(time.monotonic())
        if phase != "completed":
            return error_response(409, f"video {found.id} is {phase}, not completed", "not_ready")
        return Response(
            video_bytes(found.prompt),
            media_type="video/mp4",
            headers={"content-disposition": f'attachment; filename="{found.id}.mp4"'},
        )

    async def video_cancel(self, request: Request) -> Response:
        self.stats.cancels += 1
        found = self.job_or_404(request.path_params["vid"], api_key(request.headers) or "", OPENAI)
        if isinstance(found, Response):
            return found
        now = time.monotonic()
        if found.phase(now) not in ("queued", "in_progress"):
            return error_response(409, f"video {found.id} is {found.phase(now)}; nothing to cancel")
        found.canceled_at = now
        return JSONResponse(self.video_json(found))

    # -- fal-queue-like -------------------------------------------------------------
    def base_url(self, request: Request) -> str:
        host = request.url.hostname or "127.0.0.1"
        if self.plan.take_foreign_url():
            host = "localhost"  # reachable, but no profile names it: the allowlist must refuse
        return f"{request.url.scheme}://{host}:{request.url.port}"

    async def fal_submit(self, request: Request) -> Response:
        job, refusal = await self.submit(request, FAL)
        if refusal is not None or job is None:
            return refusal or error_response(500, "no job")
        base = f"{self.base_url(request)}/fal/requests/{job.id}"
        return JSONResponse(
            {
                "request_id": job.id,
                "status_url": f"{base}/status",
                "response_url": base,
                "cancel_url": f"{base}/cancel",
                "queue_position": self.queue_position(job, time.monotonic()),
            }
        )

    async def fal_status(self, request: Request) -> Response:
        self.stats.polls += 1
        found = self.job_or_404(request.path_params["rid"], api_key(request.headers) or "", FAL)
        if isinstance(found, Response):
            return found
        now = time.monotonic()
        phase = found.phase(now)
        answer: dict[str, Any] = {
            "status": {
                "queued": "IN_QUEUE",
                "in_progress": "IN_PROGRESS",
                "completed": "COMPLETED",
                "failed": "FAILED",
                "cancelled": "CANCELLED",
            }[phase],
            "request_id": found.id,
            "response_url": str(request.url).removesuffix("/status"),
        }
        if phase == "queued":
            answer["queue_position"] = self.queue_position(found, now)
        if phase == "failed":
            answer["error"] = {"message": found.fail_reason}
        return JSONResponse(answer)

    async def fal_result(self, request: Request) -> Response:
        self.stats.results += 1
        found = self.job_or_404(request.path_params["rid"], api_key(request.headers) or "", FAL)
        if isinstance(found, Response):
            return found
        phase = found.phase(time.monotonic())
        if phase == "failed":
            return JSONResponse({"detail": found.fail_reason}, 422)
        if phase != "completed":
            return JSONResponse({"detail": f"Request is {phase}"}, 400)
        seed = int.from_bytes(hashlib.sha256(found.prompt.encode()).digest()[:4], "big")
        url = f"{request.url.scheme}://{request.url.netloc}/fal/files/{found.id}.png"
        return JSONResponse(
            {
                "images": [{"url": url, "content_type": "image/png", "width": 64, "height": 64}],
                "prompt": found.prompt,
                "seed": seed,
            }
        )

    async def fal_cancel(self, request: Request) -> Response:
        self.stats.cancels += 1
        found = self.job_or_404(request.path_params["rid"], api_key(request.headers) or "", FAL)
        if isinstance(found, Response):
            return found
        now = time.monotonic()
        if found.phase(now) not in ("queued", "in_progress"):
            return JSONResponse({"status": "ALREADY_COMPLETED"}, 400)
        found.canceled_at = now
        return JSONResponse({"status": "CANCELLATION_REQUESTED"}, 202)

    async def fal_file(self, request: Request) -> Response:
        self.stats.downloads += 1
        job_id = request.path_params["name"].removesuffix(".png")
        found = self.job_or_404(job_id, api_key(request.headers) or "", FAL)
        if isinstance(found, Response):
            return found
        if found.phase(time.monotonic()) != "completed":
            return JSONResponse({"detail": "no such file"}, 404)
        return Response(png_bytes(found.prompt), media_type="image/png")

    async def upload_file(self, request: Request) -> Response:
        return await self.files.upload(request)  # self.files is replaced on reset

    async def file_content(self, request: Request) -> Response:
        return await self.files.content(request)

    # -- control (no auth) -----------------------------------------------------------
    async def get_stats(self, request: Request) -> Response:
        now = time.monotonic()
        active = sum(1 for j in self.jobs.values() if j.phase(now) in ("queued", "in_progress"))
        return JSONResponse(
            {
                **asdict(self.stats),
                **self.files.stats(),
                "active_jobs": active,
                "jobs": len(self.jobs),
            }
        )

    async def get_jobs(self, request: Request) -> Response:
        """Each job's end as a wall-clock epoch: a benchmark measures how late a
        client noticed the end against the vendor's own, not its submit time."""
        now, wall = time.monotonic(), time.time()
        return JSONResponse(
            {
                "jobs": [
                    {"id": j.id, "phase": j.phase(now), "ends_at": wall + (j.ends - now)}
                    for j in self.jobs.values()
                ]
            }
        )

    async def post_reset(self, request: Request) -> Response:
        self.reset()
        return JSONResponse({"ok": True})

    async def post_mode(self, request: Request) -> Response:
        try:
            body = await request.json()
            if isinstance(body, dict) and body.keys() & {"upload_ttl_s", "expire_uploads"}:
                self.files.apply_mode(body)
                if not body:
                    return JSONResponse({"ok": True, "upload_ttl_s": self.files.ttl_s})
            self.plan.apply(body)
        except (ValueError, TypeError, KeyError) as exc:
            return error_response(400, f"bad mode: {exc}")
        return JSONResponse({"ok": True, **self.plan.describe()})

    def routes(self) -> list[Route]:
        return [
            Route("/__stats", self.get_stats, methods=["GET"]),
            Route("/__jobs", self.get_jobs, methods=["GET"]),
            Route("/__reset", self.post_reset, methods=["POST"]),
            Route("/__mode", self.post_mode, methods=["POST"]),
            Route("/__keys/{switch}", self.plan.switch_keys, methods=["POST"]),
            Route("/v1/chat/completions", self.chat, methods=["POST"]),
            Route("/v1/files", self.upload_file, methods=["POST"]),
            Route("/v1/files/{fid}/content", self.file_content, methods=["GET"]),
            Route("/v1/videos", self.video_create, methods=["POST"]),
            Route("/v1/videos/{vid}", self.video_get, methods=["GET"]),
            Route("/v1/videos/{vid}/content", self.video_content, methods=["GET"]),
            Route("/v1/videos/{vid}/cancel", self.video_cancel, methods=["POST"]),
            Route("/fal/files/{name}", self.fal_file, methods=["GET"]),
            Route("/fal/requests/{rid}/status", self.fal_status, methods=["GET"]),
            Route("/fal/requests/{rid}/cancel", self.fal_cancel, methods=["PUT", "POST"]),
            Route("/fal/requests/{rid}", self.fal_result, methods=["GET"]),
            Route("/fal/{app:path}", self.fal_submit, methods=["POST"]),
        ]


def create_app(time_scale: float = 1.0, quota: int = 3) -> Starlette:
    provider = DemoProvider(time_scale=time_scale, quota=quota)
    front_door = Middleware(FrontDoor, provider=provider)
    app = Starlette(routes=provider.routes(), middleware=[front_door])
    app.state.provider = provider
    return app


async def start_demo_api(
    port: int | None = None, time_scale: float = 1.0, quota: int = 3
) -> RunningServer:
    """Serve the demo provider on 127.0.0.1 (a random free port by default)."""
    return await start_server(create_app(time_scale=time_scale, quota=quota), port)
