"""Stand-ins for fal.ai's queue, Kling, MiniMax, Alibaba DashScope (Wan) and
Volcengine Ark (Seedance), each answering as its API reference documents."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute

from tests.vendors.standin import KEY, MP4, Job, Vendor, cancel, not_found, route

KLING_SECRET = "kling-secret-" + "9" * 20


class Fal(Vendor):
    """docs.fal.ai/model-endpoints/queue: submit, status URL, response URL, cancel URL."""

    name = "fal"

    def routes(self) -> list[BaseRoute]:
        return [
            route("/{owner}/{app}/requests/{id}/status", self.status),
            route("/{owner}/{app}/requests/{id}/cancel", self.cancel, "PUT"),
            route("/{owner}/{app}/requests/{id}", self.response),
            route("/{owner}/{app}/{rest:path}", self.submit, "POST"),
            route("/files/{id}/output.mp4", self.file),
        ]

    def authorized(self, request: Request) -> bool:
        return request.headers.get("authorization") == f"Key {KEY}"

    def unauthorized(self) -> Response:
        return JSONResponse({"detail": "Invalid Key Authorization header format"}, 401)

    def throttled(self) -> Response:
        return JSONResponse(
            {"detail": "Too many requests"},
            status_code=429,
            headers={"Retry-After": str(self.retry_after_s)},
        )

    def urls(self, request: Request, job: Job) -> dict[str, str]:
        # The queue's URLs name only the app's first two path segments.
        app = f"{self.base(request)}/{request.path_params['owner']}/{request.path_params['app']}"
        return {
            "response_url": f"{app}/requests/{job.id}",
            "status_url": f"{app}/requests/{job.id}/status",
            "cancel_url": f"{app}/requests/{job.id}/cancel",
        }

    def job_missing(self) -> Response:
        return not_found("Request not found")

    async def submit(self, request: Request) -> Response:
        job = await self.submitted(request, "764cabcf-b745-4b3e-ae38-")
        if not isinstance(job, Job):
            return job
        return JSONResponse({"request_id": job.id, **self.urls(request, job), "queue_position": 0})

    async def status(self, request: Request) -> Response:
        return await self.answer(request, lambda job: self.status_answer(request, job))

    def status_answer(self, request: Request, job: Job) -> Response:
        phase = self.phase(job)
        response_url = self.urls(request, job)["response_url"]
        if phase == "queued":
            answer: dict[str, Any] = {"status": "IN_QUEUE", "queue_position": 1}
        elif phase == "running":
            answer = {"status": "IN_PROGRESS", "logs": []}
        else:  # a refused request completes too; its response answers the error
            answer = {"status": "COMPLETED", "logs": [], "metrics": {"inference_time": 1.2}}
        return JSONResponse({**answer, "response_url": response_url}, status_code=200)

    async def response(self, request: Request) -> Response:
        return await self.answer(request, lambda job: self.response_answer(request, job))

    def response_answer(self, request: Request, job: Job) -> Response:
        if "REFUSE" in job.prompt:
            detail = {
                "loc": ["body", "prompt"],
                "msg": "The content could not be processed because it contained material "
                "flagged by a content checker.",
                "type": "content_policy_violation",
                "url": "https://docs.fal.ai/errors#content_policy_violation",
            }
            return JSONResponse({"detail": [detail]}, status_code=422)
        url = f"{self.base(request)}/files/{job.id}/output.mp4"
        video = {"url": url, "content_type": "video/mp4", "file_name": "output.mp4"}
        return JSONResponse({"video": {**video, "file_size": len(MP4)}})

    async def cancel(self, request: Request) -> Response:
        requested = JSONResponse({"status": "CANCELLATION_REQUESTED"}, status_code=202)
        return await self.answer(request, lambda job: cancel(job, requested), keyed=False)


def _b64url_decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def verify_hs256(token: str, secret: str, now: float) -> dict[str, Any] | None:
    """The claims of a valid, unexpired HS256 JWT; None otherwise (the vendor's check)."""
    try:
        header, body, signature = token.split(".")
        expected = hmac.new(secret.encode(), f"{header}.{body}".encode(), hashlib.sha256).digest()
        if not hmac.compare_digest(expected, _b64url_decode(signature)):
            return None
        if json.loads(_b64url_decode(header)) != {"alg": "HS256", "typ": "JWT"}:
            return None
        claims = json.loads(_b64url_decode(body))
    except (ValueError, TypeError):
        return None
    if not isinstance(claims, dict) or claims.get("exp", 0) <= now or claims.get("nbf", 0) > now:
        return None
    return claims


class Kling(Vendor):
    """app.klingai.com/global/dev/document-api: a JWT per request, answers wrapped in code/data."""

    name = "kling"
    refusal_at = "submit"

    def routes(self) -> list[BaseRoute]:
        return [
            route("/v1/videos/text2video", self.create, "POST"),
            route("/v1/videos/text2video/{id}", self.query),
            route("/files/{id}.mp4", self.file),
        ]

    def authorized(self, request: Request) -> bool:
        auth = request.headers.get("authorization", "")
        if not auth.startswith("Bearer "):
            return False
        claims = verify_hs256(auth.removeprefix("Bearer "), KLING_SECRET, time.time())
        return claims is not None and claims.get("iss") == KEY

    def wrapped(self, code: int, message: str, data: Any = None, status: int = 200) -> JSONResponse:
        body: dict[str, Any] = {"code": code, "message": message, "request_id": "req-standin"}
        if data is not None:
            body["data"] = data
        return JSONResponse(body, status_code=status)

    def unauthorized(self) -> Response:
        return self.wrapped(1004, "Authorization is not valid", status=401)

    def throttled(self) -> Response:
        response = self.wrapped(1302, "API request too fast, please slow down", status=429)
        response.headers["Retry-After"] = str(self.retry_after_s)
        return response

    def refused(self) -> Response:
        return self.wrapped(1301, "Trigger the content security policy of the platform", status=400)

    def task(self, request: Request, job: Job, phase: str) -> dict[str, Any]:
        status = {"queued": "submitted", "running": "processing", "done": "succeed"}[phase]
        data: dict[str, Any] = {
            "task_id": job.id,
            "task_status": status,
            "task_status_msg": "",
            "task_info": {},
            "created_at": job.created * 1000,
            "updated_at": job.created * 1000 + job.polls,
        }
        if phase == "done":
            video = {"id": f"v{job.id}", "url": f"{self.base(request)}/files/{job.id}.mp4"}
            data["task_result"] = {"videos": [{**video, "duration": "5"}]}
        return data

    def job_missing(self) -> Response:
        return self.wrapped(1203, "task not found", status=404)

    async def create(self, request: Request) -> Response:
        job = await self.submitted(request, "8662")
        if not isinstance(job, Job):
            return job
        return self.wrapped(0, "SUCCEED", self.task(request, job, "queued"))

    async def query(self, request: Request) -> Response:
        return await self.answer(
            request,
            lambda job: self.wrapped(0, "SUCCEED", self.task(request, job, self.phase(job))),
        )


def _base_resp(code: int = 0, message: str = "success") -> dict[str, Any]:
    return {"status_code": code, "status_msg": message}


class MiniMax(Vendor):
    """platform.minimax.io/docs: video task, query, then the file by file_id."""

    name = "minimax"

    def routes(self) -> list[BaseRoute]:
        return [
            route("/v1/video_generation", self.create, "POST"),
            route("/v1/query/video_generation", self.query),
            route("/v1/files/retrieve", self.retrieve),
            route("/files/{id}/output.mp4", self.file),
        ]

    def unauthorized(self) -> Response:
        return JSONResponse({"base_resp": _base_resp(1004, "login fail")})

    def throttled(self) -> Response:
        # MiniMax reports errors with HTTP 200 and a non-zero status_code.
        return JSONResponse({"task_id": "", "base_resp": _base_resp(1002, "rate limit exceeded")})

    def job_missing(self) -> Response:
        return JSONResponse({"task_id": "", "base_resp": _base_resp(2013, "task not found")})

    async def create(self, request: Request) -> Response:
        job = await self.submitted(request, "1069161122")
        if not isinstance(job, Job):
            return job
        return JSONResponse({"task_id": job.id, "base_resp": _base_resp()})

    async def query(self, request: Request) -> Response:
        task_id = request.query_params.get("task_id", "")
        return await self.answer(request, self.task_answer, job_id=task_id)

    def task_answer(self, job: Job) -> Response:
        phase = self.phase(job)
        answer: dict[str, Any] = {"task_id": job.id, "base_resp": _base_resp()}
        if phase == "queued":
            answer["status"] = "Queueing"
        elif phase == "running":
            answer["status"] = "Processing"
        elif phase == "refused":
            answer.update(status="Fail", base_resp=_base_resp(1026, "input new_sensitive"))
        else:
            answer.update(
                status="Success", file_id=f"f{job.id}", video_width=1920, video_height=1080
            )
        return JSONResponse(answer)

    async def retrieve(self, request: Request) -> Response:
        await self.record(request)
        if not self.authorized(request):
            return self.unauthorized()
        file_id = request.query_params.get("file_id", "")
        job = self.job(file_id.removeprefix("f"))
        if job is None:
            return JSONResponse({"base_resp": _base_resp(1013, "file not found")})
        url = f"{self.base(request)}/files/{job.id}/output.mp4"
        file = {
            "file_id": file_id,
            "bytes": len(MP4),
            "created_at": job.created,
            "filename": "output.mp4",
            "purpose": "video_generation",
            "download_url": url,
        }
        return JSONResponse({"file": file, "base_resp": _base_resp()})


class DashScope(Vendor):
    """alibabacloud.com/help/en/model-studio: async video synthesis and task polling."""

    name = "dashscope"

    def routes(self) -> list[BaseRoute]:
        return [
            route("/api/v1/services/aigc/video-generation/video-synthesis", self.create, "POST"),
            route("/api/v1/tasks/{id}", self.task),
            route("/api/v1/tasks/{id}/cancel", self.cancel, "POST"),
            route("/oss/{id}.mp4", self.file),
        ]

    def error(self, status: int, code: str, message: str) -> JSONResponse:
        body = {"request_id": "7574ee8f-38a3-4b1e-9280-standin", "code": code, "message": message}
        return JSONResponse(body, status_code=status)

    def unauthorized(self) -> Response:
        return self.error(401, "InvalidApiKey", "Invalid API-key provided.")

    def throttled(self) -> Response:
        response = self.error(
            429, "Throttling.RateQuota", "Requests rate limit exceeded, please try again later."
        )
        response.headers["Retry-After"] = str(self.retry_after_s)
        return response

    def prompt_of(self, body: Any) -> str:
        return str(body.get("input", {}).get("prompt", ""))

    async def create(self, request: Request) -> Response:
        body = await self.read_json(request)
        if request.headers.get("x-dashscope-async") != "enable":
            return self.error(
                403, "AccessDenied", "current user api does not support synchronous calls"
            )
        if (refusal := await self.gate(request)) is not None:
            return refusal
        job = self.new_job(body, "0385dc79-5ff8-4d82-bcb6-")
        output = {"task_status": "PENDING", "task_id": job.id}
        return JSONResponse({"output": output, "request_id": "4909100c-standin"})

    def job_missing(self) -> Response:
        return self.error(404, "NotFound", "task not found")

    async def task(self, request: Request) -> Response:
        return await self.answer(request, lambda job: self.task_answer(request, job))

    def task_answer(self, request: Request, job: Job) -> Response:
        phase = self.phase(job)
        output: dict[str, Any] = {"task_id": job.id, "submit_time": "2025-10-01 12:00:00.000"}
        status = {"queued": "PENDING", "running": "RUNNING", "done": "SUCCEEDED"}
        output["task_status"] = status.get(phase, "CANCELED" if phase == "canceled" else "FAILED")
        if phase == "done":
            output["video_url"] = f"{self.base(request)}/oss/{job.id}.mp4"
            output["orig_prompt"] = job.prompt
        if phase == "refused":
            output["code"] = "DataInspectionFailed"
            output["message"] = "Input data may contain inappropriate content."
        answer: dict[str, Any] = {"request_id": "6f4a1b2c-standin", "output": output}
        if phase == "done":
            answer["usage"] = {"duration": 5, "video_count": 1, "SR": 1080}
        return JSONResponse(answer)

    async def cancel(self, request: Request) -> Response:
        accepted = JSONResponse({"request_id": "c1a2b3-standin"})
        return await self.answer(request, lambda job: cancel(job, accepted), keyed=False)


class Ark(Vendor):
    """volcengine.com/docs/82379: content generation tasks (Seedance)."""

    name = "ark"
    refusal_at = "submit"

    def routes(self) -> list[BaseRoute]:
        return [
            route("/api/v3/contents/generations/tasks", self.create, "POST"),
            route("/api/v3/contents/generations/tasks/{id}", self.get),
            route("/api/v3/contents/generations/tasks/{id}", self.delete, "DELETE"),
            route("/tos/{id}.mp4", self.file),
        ]

    def error(self, status: int, code: str, message: str, kind: str) -> JSONResponse:
        body = {"error": {"code": code, "message": message, "param": "", "type": kind}}
        return JSONResponse(body, status_code=status)

    def unauthorized(self) -> Response:
        return self.error(
            401, "AuthenticationError", "the API key in the request is invalid", "Unauthorized"
        )

    def throttled(self) -> Response:
        response = self.error(
            429,
            "RateLimitExceeded.EndpointRPMExceeded",
            "The request has exceeded the rate limit of the endpoint.",
            "TooManyRequests",
        )
        response.headers["Retry-After"] = str(self.retry_after_s)
        return response

    def refused(self) -> Response:
        return self.error(
            400,
            "InputTextSensitiveContentDetected",
            "The request failed because the input text may contain sensitive information.",
            "BadRequest",
        )

    def prompt_of(self, body: Any) -> str:
        return " ".join(str(c.get("text", "")) for c in body.get("content", []))

    def job_missing(self) -> Response:
        return self.error(404, "ResourceNotFound", "task not found", "NotFound")

    async def create(self, request: Request) -> Response:
        job = await self.submitted(request, "cgt-20251001120000-")
        return JSONResponse({"id": job.id}) if isinstance(job, Job) else job

    async def get(self, request: Request) -> Response:
        return await self.answer(request, lambda job: self.task_answer(request, job))

    def task_answer(self, request: Request, job: Job) -> Response:
        phase = self.phase(job)
        status = {"queued": "queued", "running": "running", "done": "succeeded"}
        answer: dict[str, Any] = {
            "id": job.id,
            "model": job.body.get("model", "seedance-1-0-pro-250528"),
            "status": status.get(phase, "cancelled"),
            "created_at": job.created,
            "updated_at": job.created + job.polls,
        }
        if phase == "done":
            answer["content"] = {"video_url": f"{self.base(request)}/tos/{job.id}.mp4"}
            answer["usage"] = {"completion_tokens": 246840, "total_tokens": 246840}
            answer.update(seed=10, resolution="1080p", ratio="16:9", duration=5)
        return JSONResponse(answer)

    async def delete(self, request: Request) -> Response:
        return await self.answer(request, lambda job: cancel(job, JSONResponse({})), keyed=False)


VENDORS_B = [Fal, Kling, MiniMax, DashScope, Ark]
