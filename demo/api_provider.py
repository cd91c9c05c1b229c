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
shows what it saw; ``POST /__reset`` forgets everything. Generation times are
nominal seconds times `time_scale`; Retry-After values are real time.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import re
import struct
import time
import uuid
import zlib
from collections import Counter
from dataclasses import asdict, dataclass, field
from email.utils import formatdate
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dispatcher.serving import RunningServer, start_server

OPENAI, FAL = "openai", "fal"
DEFAULT_JOB_S = 3.0
DEFAULT_CHAT_S = 1.0
QUEUE_SHARE = 0.2  # the first fifth of a job is spent queued
# A request that was already on its way when we sent a 429 could not have
# known about it; only requests arriving later than this count as early. It
# is generous because in tests one loaded event loop serves both ends, and a
# request sent before the 429 was read can reach us a few hundred ms later.
IN_FLIGHT_GRACE_S = 0.5
_OPERATIONS = ("chat", "submit", "poll", "result", "content", "cancel")
_DIRECTIVE = re.compile(r"\[(\w+)=([^\]]*)\]")
PERMANENT_REASON = "moderation_blocked: the prompt was refused by the safety system"
TRANSIENT_REASON = "internal_error: the worker crashed, please try again"


@dataclass
class Stats:
    requests: int = 0
    submits: int = 0
    jobs_created: int = 0
    polls: int = 0
    results: int = 0
    downloads: int = 0
    cancels: int = 0
    chat_completions: int = 0
    duplicate_submits: int = 0
    rate_limited: int = 0
    early_requests: int = 0
    unauthorized: int = 0
    hangups: int = 0  # chat clients that left before their answer
    faults: int = 0
    max_concurrent: int = 0
    max_concurrent_by_vendor: dict[str, int] = field(default_factory=dict)
    early_log: list[dict[str, float]] = field(default_factory=list)  # the last early ones


@dataclass
class Fault:
    mode: str
    remaining: int
    only: str | None = None  # chat|submit|poll|result|content|cancel
    status: int | None = None
    retry_after_s: float = 1.0
    header: str = "seconds"  # seconds|ms|date|both
    when: str = "before"  # before|after|mid (drop)
    delay_s: float = 1.0  # slow, nominal


@dataclass
class Job:
    id: str
    vendor: str
    key: str
    prompt: str
    model: str
    created: float
    queue_s: float
    run_s: float
    fail_reason: str | None = None
    canceled_at: float | None = None
    seconds: str = "4"

    @property
    def ends(self) -> float:
        share = 0.5 if self.fail_reason else 1.0  # failures come halfway through
        return self.created + self.queue_s + self.run_s * share

    def phase(self, now: float) -> str:
        if self.canceled_at is not None and self.canceled_at < self.ends:
            return "cancelled"
        if now < self.created + self.queue_s:
            return "queued"
        if now < self.ends:
            return "in_progress"
        return "failed" if self.fail_reason else "completed"

    def progress(self, now: float) -> int:
        phase = self.phase(now)
        if phase == "completed":
            return 100
        if phase != "in_progress" or self.run_s <= 0:
            return 0
        return min(99, int(100 * (now - self.created - self.queue_s) / self.run_s))


def directives(text: str) -> dict[str, str]:
    return {k.lower(): v.strip() for k, v in _DIRECTIVE.findall(text)}


def _seconds(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value) if math.isfinite(value) and value >= 0 else None
    if isinstance(value, str):
        try:
            return _seconds(float(value))
        except ValueError:
            return None
    return None


def _duration(marks: dict[str, str], body: dict[str, Any], default: float) -> float:
    """Nominal generation seconds: a [duration=x] directive, else gen_s, else default."""
    for value in (marks.get("duration"), body.get("gen_s")):
        found = _seconds(value)
        if found is not None:
            return found
    return default


def _error(status: int, message: str, code: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": code, "code": code}}, status)


def _box(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", 8 + len(payload)) + kind + payload


def _stream(seed: str, size: int) -> bytes:
    out = bytearray()
    counter = 0
    while len(out) < size:
        out += hashlib.sha256(f"{seed}:{counter}".encode()).digest()
        counter += 1
    return bytes(out[:size])


def video_bytes(prompt: str, size: int = 16 * 1024) -> bytes:
    """A small, deterministic stand-in for an MP4 (ftyp + mdat boxes)."""
    ftyp = _box(b"ftyp", b"isom\x00\x00\x02\x00isomiso2mp41")
    return ftyp + _box(b"mdat", _stream(prompt, size - len(ftyp) - 8))


def png_bytes(prompt: str, side: int = 64) -> bytes:
    """A real, deterministic PNG whose colours come from the prompt."""
    r, g, b = hashlib.sha256(prompt.encode()).digest()[:3]
    rows = b"".join(
        b"\x00" + b"".join(bytes((r, (g + 3 * y) % 256, (b + 3 * x) % 256)) for x in range(side))
        for y in range(side)
    )

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = struct.pack(">I", zlib.crc32(kind + data))
        return struct.pack(">I", len(data)) + kind + data + crc

    header = struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def operation(method: str, path: str) -> tuple[str, str] | None:
    """(vendor, operation) of a request, for quotas, stats and fault filters."""
    parts = [p for p in path.split("/") if p]
    if parts[:2] == ["v1", "chat"]:
        return OPENAI, "chat"
    if parts[:2] == ["v1", "videos"]:
        if len(parts) == 2:
            return OPENAI, "submit"
        tail = parts[3] if len(parts) > 3 else ""
        return OPENAI, {"": "poll", "content": "content", "cancel": "cancel"}.get(tail, "poll")
    if parts[:1] == ["fal"]:
        if parts[1:2] == ["files"]:
            return FAL, "content"
        if parts[1:2] == ["requests"]:
            tail = parts[3] if len(parts) > 3 else ""
            return FAL, {"": "result", "status": "poll", "cancel": "cancel"}.get(tail, "poll")
        return FAL, "submit" if method == "POST" else "poll"
    return None


def api_key(headers: Any) -> str | None:
    value = str(headers.get("authorization", ""))
    scheme, _, token = value.partition(" ")
    if scheme.lower() in ("bearer", "key") and token.strip():
        return token.strip()
    return None


class DemoProvider:
    def __init__(self, time_scale: float = 1.0, quota: int = 3) -> None:
        if time_scale <= 0 or quota < 1:
            raise ValueError("time_scale must be > 0 and quota >= 1")
        self.time_scale = time_scale
        self.quota = quota
        self.reset()

    def reset(self) -> None:
        self.stats = Stats()
        self.jobs: dict[str, Job] = {}
        self.idempotency: dict[tuple[str, str, str], str] = {}
        self.chat_answers: dict[tuple[str, str], dict[str, Any]] = {}
        self.chats_in_flight: Counter[tuple[str, str]] = Counter()
        # (key, vendor) -> [(when the 429 was sent, until when), ...]
        self.deadlines: dict[tuple[str, str], list[tuple[float, float]]] = {}
        self.faults: list[Fault] = []
        self.failing_jobs: list[str] = []  # reasons for the next jobs created
        self.foreign_urls = 0

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
        if header in ("ms", "both"):
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
        for fault in self.faults:
            if fault.remaining > 0 and (fault.only is None or fault.only == op):
                fault.remaining -= 1
                self.stats.faults += 1
                return fault
        return None

    def new_job(self, vendor: str, key: str, body: dict[str, Any], prompt: str) -> Job:
        marks = directives(prompt)
        total = _duration(marks, body, DEFAULT_JOB_S) * self.time_scale
        reason = None
        if marks.get("fail") == "permanent":
            reason = PERMANENT_REASON
        elif marks.get("fail") == "transient":
            reason = TRANSIENT_REASON
        elif self.failing_jobs:
            reason = self.failing_jobs.pop(0)
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
        try:
            body = await request.json()
        except ValueError:
            return None, _error(400, "the body is not JSON")
        if not isinstance(body, dict):
            return None, _error(400, "the body must be a JSON object")
        prompt = body.get("prompt")
        if not isinstance(prompt, str) or not prompt.strip():
            return None, _error(400, "`prompt` is required and must be a non-empty string")
        if "gen_s" in body and _seconds(body["gen_s"]) is None:
            return None, _error(400, "`gen_s` must be a non-negative number")
        forced = directives(prompt).get("status", "")
        if forced.isdigit() and int(forced) >= 400:
            return None, _error(int(forced), f"forced status {forced} by the prompt")
        idem = request.headers.get("idempotency-key")
        if idem and (key, vendor, idem) in self.idempotency:
            self.stats.duplicate_submits += 1
            return self.jobs[self.idempotency[(key, vendor, idem)]], None
        refusal = self.admit(key, vendor)
        if refusal is not None:
            return None, refusal
        job = self.new_job(vendor, key, body, prompt)
        if idem:
            self.idempotency[(key, vendor, idem)] = job.id
        return job, None

    def job_or_404(self, job_id: str, key: str, vendor: str) -> Job | JSONResponse:
        job = self.jobs.get(job_id)
        if job is None or job.key != key or job.vendor != vendor:
            return _error(404, f"no job {job_id!r}", "not_found")
        return job

    async def generate(self, request: Request, seconds: float) -> bool:
        """Take `seconds` to answer; False when the client hung up first, which
        stops the generation (and frees the quota) as real providers do."""

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
            return _error(400, "the body is not JSON")
        messages = body.get("messages") if isinstance(body, dict) else None
        last = messages[-1] if isinstance(messages, list) and messages else None
        content = last.get("content") if isinstance(last, dict) else None
        if not isinstance(content, str):
            return _error(400, "`messages` must end with a message whose `content` is a string")
        marks = directives(content)
        forced = marks.get("status", "")
        if forced.isdigit() and int(forced) >= 400:
            return _error(int(forced), f"forced status {forced} by the prompt")
        idem = request.headers.get("idempotency-key")
        if idem and (key, idem) in self.chat_answers:
            self.stats.duplicate_submits += 1
            return JSONResponse(self.chat_answers[(key, idem)])
        refusal = self.admit(key, OPENAI)
        if refusal is not None:
            return refusal
        self.chats_in_flight[(key, OPENAI)] += 1
        try:
            seconds = _duration(marks, body, DEFAULT_CHAT_S) * self.time_scale
            if not await self.generate(request, seconds):
                self.stats.hangups += 1
                return Response(status_code=499)  # nobody is listening any more
        finally:
            self.chats_in_flight[(key, OPENAI)] -= 1
        if marks.get("fail") == "permanent":
            return _error(400, PERMANENT_REASON, "content_policy_violation")
        if marks.get("fail") == "transient":
            return _error(500, TRANSIENT_REASON, "server_error")
        text = _DIRECTIVE.sub("", content).strip()
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
            return _error(409, f"video {found.id} is {phase}, not completed", "not_ready")
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
            return _error(409, f"video {found.id} is {found.phase(now)}; nothing to cancel")
        found.canceled_at = now
        return JSONResponse(self.video_json(found))

    # -- fal-queue-like -------------------------------------------------------------
    def base_url(self, request: Request) -> str:
        host = request.url.hostname or "127.0.0.1"
        if self.foreign_urls > 0:
            self.foreign_urls -= 1
            host = "localhost"  # reachable, but no profile names it: the allowlist must refuse
        return f"{request.url.scheme}://{host}:{request.url.port}"

    async def fal_submit(self, request: Request) -> Response:
        job, refusal = await self.submit(request, FAL)
        if refusal is not None or job is None:
            return refusal or _error(500, "no job")
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

    # -- control (no auth) -----------------------------------------------------------
    async def get_stats(self, request: Request) -> Response:
        now = time.monotonic()
        active = sum(1 for j in self.jobs.values() if j.phase(now) in ("queued", "in_progress"))
        return JSONResponse({**asdict(self.stats), "active_jobs": active, "jobs": len(self.jobs)})

    async def post_reset(self, request: Request) -> Response:
        self.reset()
        return JSONResponse({"ok": True})

    async def post_mode(self, request: Request) -> Response:
        try:
            body = await request.json()
            fault = self.parse_mode(body)
        except (ValueError, TypeError, KeyError) as exc:
            return _error(400, f"bad mode: {exc}")
        if fault is not None:
            self.faults.append(fault)
        return JSONResponse(
            {
                "ok": True,
                "faults": [asdict(f) for f in self.faults if f.remaining],
                "failing_jobs": len(self.failing_jobs),
                "foreign_urls": self.foreign_urls,
            }
        )

    def parse_mode(self, body: Any) -> Fault | None:
        """One ``POST /__mode`` body. Each fault hits the next `count` requests
        (only those of operation `only` when given: chat, submit, poll, result,
        content, cancel):

        - ``429_storm``: 429 with Retry-After `retry_after_s` (default 1) sent
          as `header`: seconds (default), ms (retry-after-ms), date or both.
        - ``5xx``: `status` (default 503); with `retry_after_s`, a Retry-After.
        - ``slow``: the answer starts `delay_s` nominal seconds late.
        - ``drop``: the connection is closed `when`: before the work, after it
          (the job exists, the answer is lost), or mid-answer (half a body).
        - ``fail_jobs``: the next `count` jobs fail; `reason` permanent,
          transient (default) or any text.
        - ``foreign_urls``: the next fal submits hand back URLs on "localhost".
        - ``clear``: forget all of the above.
        """
        if not isinstance(body, dict):
            raise TypeError('send a JSON object like {"mode": "429_storm", "count": 3}')
        mode = str(body["mode"])
        count = int(body.get("count", 1))
        only = body.get("only")
        if only is not None and only not in _OPERATIONS:
            raise ValueError(f"unknown `only` {only!r}")
        if mode == "clear":
            self.faults.clear()
            self.failing_jobs.clear()
            self.foreign_urls = 0
            return None
        if mode == "fail_jobs":
            reason = str(body.get("reason", "transient"))
            known = {"permanent": PERMANENT_REASON, "transient": TRANSIENT_REASON}
            text = known.get(reason, reason)
            self.failing_jobs.extend([text] * count)
            return None
        if mode == "foreign_urls":
            self.foreign_urls += count
            return None
        header = str(body.get("header", "seconds"))
        if header not in ("seconds", "ms", "date", "both"):
            raise ValueError(f"unknown `header` {header!r}")
        if mode == "429_storm":
            return Fault(mode, count, only, 429, float(body.get("retry_after_s", 1.0)), header)
        if mode == "5xx":
            wait = body.get("retry_after_s")
            return Fault(
                mode,
                count,
                only,
                int(body.get("status", 503)),
                -1.0 if wait is None else float(wait),
                header,
            )
        if mode == "slow":
            return Fault(mode, count, only, delay_s=float(body.get("delay_s", 1.0)))
        if mode == "drop":
            when = str(body.get("when", "before"))
            if when not in ("before", "after", "mid"):
                raise ValueError(f"unknown `when` {when!r}")
            return Fault(mode, count, only, when=when)
        raise ValueError(f"unknown mode {mode!r}")

    def routes(self) -> list[Route]:
        return [
            Route("/__stats", self.get_stats, methods=["GET"]),
            Route("/__reset", self.post_reset, methods=["POST"]),
            Route("/__mode", self.post_mode, methods=["POST"]),
            Route("/v1/chat/completions", self.chat, methods=["POST"]),
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


async def _drop(receive: Receive) -> None:
    """Close the connection with no response, as a flaky network would.

    ASGI has no verb for this; uvicorn's receive is a method of the request
    cycle, which holds the transport.
    """
    cycle = getattr(receive, "__self__", None)
    transport = getattr(cycle, "transport", None)
    if transport is None:
        raise RuntimeError("dropping connections needs uvicorn's HTTP/1.1 server")
    transport.abort()
    for _ in range(400):  # let uvicorn see the disconnect, so it logs no error
        if getattr(cycle, "disconnected", True):
            return
        await asyncio.sleep(0.005)


class _FrontDoor:
    """Counts, authenticates and misbehaves on demand before any route runs."""

    def __init__(self, app: ASGIApp, provider: DemoProvider) -> None:
        self.app = app
        self.provider = provider

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"].startswith("/__"):
            await self.app(scope, receive, send)
            return
        p = self.provider
        p.stats.requests += 1
        request = Request(scope)
        key = api_key(request.headers)
        vendor, op = operation(scope["method"], scope["path"]) or (OPENAI, "other")
        p.note_arrival(key, vendor)
        fault = p.take_fault(op)
        if fault is not None and fault.mode == "slow":
            await asyncio.sleep(fault.delay_s * p.time_scale)
        if fault is not None and fault.mode == "429_storm":
            refusal = p.too_many(key, vendor, fault.retry_after_s, fault.header, "storm")
            await refusal(scope, receive, send)
            return
        if fault is not None and fault.mode == "5xx":
            status, message = fault.status or 503, "the server is overloaded, retry later"
            if fault.retry_after_s >= 0:
                response = p.refuse(status, key, vendor, fault.retry_after_s, fault.header, message)
            else:
                response = _error(status, message, "server_error")
            await response(scope, receive, send)
            return
        if fault is not None and fault.mode == "drop" and fault.when == "before":
            await _drop(receive)
            return
        if key is None:
            p.stats.unauthorized += 1
            missing = _error(
                401, "missing API key: send Authorization: Bearer <key>", "invalid_api_key"
            )
            await missing(scope, receive, send)
            return
        if fault is not None and fault.mode == "drop":
            await self._answer_then_drop(scope, receive, send, mid=fault.when == "mid")
            return
        await self.app(scope, receive, send)

    async def _answer_then_drop(
        self, scope: Scope, receive: Receive, send: Send, *, mid: bool
    ) -> None:
        """Do the work (a job may be created), then lose the answer on the wire."""
        body_sent = False

        async def lossy(message: Message) -> None:
            nonlocal body_sent
            if not mid:
                return
            if message["type"] == "http.response.start":
                await send(message)
            elif message["type"] == "http.response.body" and not body_sent:
                body_sent = True
                body = message.get("body", b"")
                await send(
                    {
                        "type": "http.response.body",
                        "body": body[: len(body) // 2],
                        "more_body": True,
                    }
                )

        await self.app(scope, receive, lossy)
        await _drop(receive)


def create_app(time_scale: float = 1.0, quota: int = 3) -> Starlette:
    provider = DemoProvider(time_scale=time_scale, quota=quota)
    front_door = Middleware(_FrontDoor, provider=provider)
    app = Starlette(routes=provider.routes(), middleware=[front_door])
    app.state.provider = provider
    return app


async def start_demo_api(
    port: int | None = None, time_scale: float = 1.0, quota: int = 3
) -> RunningServer:
    """Serve the demo provider on 127.0.0.1 (a random free port by default)."""
    return await start_server(create_app(time_scale=time_scale, quota=quota), port)
