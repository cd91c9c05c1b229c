"""Stand-ins for OpenAI, Google Gemini, Runway, Luma and Replicate, each
answering as its API reference documents (states, field names, error
bodies, rate-limit headers). `test_vendor_sdk_types` checks the answers
against each vendor's official SDK types."""

from __future__ import annotations

import base64
from typing import Any, ClassVar

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute

from tests.vendors.standin import KEY, PNG, Job, Vendor, cancel, media, not_found, route


def _openai_error(status: int, message: str, kind: str, code: str | None) -> JSONResponse:
    body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return JSONResponse(body, status_code=status)


class OpenAI(Vendor):
    """platform.openai.com/docs/api-reference: videos and images."""

    name = "openai"
    refusal_at = "submit"
    # Every answer reports the request window, as the API does.
    limit_headers: ClassVar[dict[str, str]] = {
        "x-ratelimit-limit-requests": "50",
        "x-ratelimit-remaining-requests": "49",
        "x-ratelimit-reset-requests": "1.2s",
    }

    def routes(self) -> list[BaseRoute]:
        return [
            route("/v1/videos", self.create_video, "POST"),
            route("/v1/videos/{id}", self.get_video),
            route("/v1/videos/{id}/content", self.content),
            route("/v1/images/generations", self.images, "POST"),
            route("/v1/chat/completions", self.chat, "POST"),
        ]

    def unauthorized(self) -> Response:
        return _openai_error(
            401, "Incorrect API key provided.", "invalid_request_error", "invalid_api_key"
        )

    def throttled(self) -> Response:
        response = _openai_error(
            429, "Rate limit reached for requests", "requests", "rate_limit_exceeded"
        )
        response.headers.update(
            {**self.limit_headers, "x-ratelimit-remaining-requests": "0", "retry-after": "1"}
        )
        return response

    def quota_spent(self) -> Response:
        return _openai_error(
            429,
            "You exceeded your current quota, please check your plan and billing details.",
            "insufficient_quota",
            "insufficient_quota",
        )

    def headers(self) -> dict[str, str]:
        window = self.state.window.get(self.name)
        if window is None:
            return self.limit_headers
        remaining, reset = window
        return {
            **self.limit_headers,
            "x-ratelimit-remaining-requests": remaining,
            "x-ratelimit-reset-requests": reset,
        }

    def refused(self) -> Response:
        return _openai_error(
            400,
            "Your request was blocked by our moderation system.",
            "invalid_request_error",
            "moderation_blocked",
        )

    def video(self, job: Job, phase: str) -> dict[str, Any]:
        status = {"queued": "queued", "running": "in_progress", "done": "completed"}[phase]
        return {
            "id": job.id,
            "object": "video",
            "model": job.body.get("model", "sora-2"),
            "status": status,
            "progress": {"queued": 0, "running": 45, "done": 100}[phase],
            "created_at": job.created,
            "completed_at": job.created + 60 if phase == "done" else None,
            "expires_at": job.created + 3600 if phase == "done" else None,
            "prompt": job.prompt,
            "remixed_from_video_id": None,
            "seconds": str(job.body.get("seconds", "4")),
            "size": job.body.get("size", "720x1280"),
            "error": None,
        }

    def job_missing(self) -> Response:
        return _openai_error(404, "Video not found", "invalid_request_error", None)

    async def create_video(self, request: Request) -> Response:
        job = await self.submitted(request, "video_")
        if not isinstance(job, Job):
            return job
        return JSONResponse(self.video(job, "queued"), headers=self.headers())

    async def get_video(self, request: Request) -> Response:
        return await self.answer(
            request,
            lambda job: JSONResponse(self.video(job, self.phase(job)), headers=self.headers()),
        )

    async def content(self, request: Request) -> Response:
        return await self.answer(request, lambda job: media(*self.output))

    async def images(self, request: Request) -> Response:
        job = await self.submitted(request, "img_")
        if not isinstance(job, Job):
            return job
        body = job.body
        answer = {
            "created": 1_760_000_000,
            "background": body.get("background", "opaque"),
            "output_format": "png",
            "quality": body.get("quality", "medium"),
            "size": body.get("size", "1024x1024"),
            "data": [{"b64_json": base64.b64encode(PNG).decode()}],
            "usage": {
                "input_tokens": 12,
                "input_tokens_details": {"image_tokens": 0, "text_tokens": 12},
                "output_tokens": 272,
                "total_tokens": 284,
            },
        }
        return JSONResponse(answer, headers=self.headers())

    async def chat(self, request: Request) -> Response:
        job = await self.submitted(request, "chatcmpl-")
        if not isinstance(job, Job):
            return job
        prompt = str(job.body["messages"][-1]["content"])
        answer = {
            "id": job.id,
            "object": "chat.completion",
            "created": job.created,
            "model": "gpt-4.1-mini-2025-04-14",
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": f"An answer to: {prompt}",
                        "refusal": None,
                        "annotations": [],
                    },
                    "logprobs": None,
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 9, "completion_tokens": 12, "total_tokens": 21},
            "service_tier": "default",
            "system_fingerprint": "fp_standin",
        }
        return JSONResponse(answer, headers=self.headers())


def _google_error(status: int, message: str, code: str) -> JSONResponse:
    return JSONResponse(
        {"error": {"code": status, "message": message, "status": code}}, status_code=status
    )


class Gemini(Vendor):
    """ai.google.dev/api: predictLongRunning operations (Veo) and predict (Imagen)."""

    name = "gemini"
    veo = "veo-3.0-generate-001"

    def routes(self) -> list[BaseRoute]:
        return [
            route("/v1beta/models/{model}:predictLongRunning", self.long_running, "POST"),
            route("/v1beta/models/{model}/operations/{id}", self.operation),
            route("/v1beta/files/{id}:download", self.download),
            route("/v1beta/models/{model}:predict", self.predict, "POST"),
        ]

    def authorized(self, request: Request) -> bool:
        return request.headers.get("x-goog-api-key") == KEY

    def unauthorized(self) -> Response:
        return _google_error(
            400, "API key not valid. Please pass a valid API key.", "INVALID_ARGUMENT"
        )

    def throttled(self) -> Response:
        response = _google_error(
            429, "Resource has been exhausted (e.g. check quota).", "RESOURCE_EXHAUSTED"
        )
        response.headers["Retry-After"] = str(self.retry_after_s)
        return response

    def prompt_of(self, body: Any) -> str:
        return str(body["instances"][0].get("prompt", ""))

    def operation_answer(self, request: Request, job: Job, phase: str) -> dict[str, Any]:
        name = f"models/{self.veo}/operations/{job.id}"
        if phase in ("queued", "running"):
            return {"name": name}  # `done` is left out until the operation ends
        response: dict[str, Any] = {
            "@type": "type.googleapis.com/google.ai.generativelanguage.v1beta."
            "PredictLongRunningResponse",
        }
        if phase == "refused":
            response["generateVideoResponse"] = {
                "raiMediaFilteredCount": 1,
                "raiMediaFilteredReasons": [
                    "Unable to generate videos because the prompt violates "
                    "Google's Responsible AI practices."
                ],
            }
        else:
            uri = f"{self.base(request)}/v1beta/files/{job.id}:download?alt=media"
            response["generateVideoResponse"] = {"generatedSamples": [{"video": {"uri": uri}}]}
        return {"name": name, "done": True, "response": response}

    def job_missing(self) -> Response:
        return _google_error(404, "Operation not found.", "NOT_FOUND")

    async def long_running(self, request: Request) -> Response:
        job = await self.submitted(request, "op")
        if not isinstance(job, Job):
            return job
        return JSONResponse({"name": f"models/{request.path_params['model']}/operations/{job.id}"})

    async def operation(self, request: Request) -> Response:
        return await self.answer(
            request, lambda job: JSONResponse(self.operation_answer(request, job, self.phase(job)))
        )

    async def download(self, request: Request) -> Response:
        return await self.answer(request, lambda job: media(*self.output))

    async def predict(self, request: Request) -> Response:
        job = await self.submitted(request, "imagen")
        if not isinstance(job, Job):
            return job
        image = {"mimeType": "image/png", "bytesBase64Encoded": base64.b64encode(PNG).decode()}
        return JSONResponse({"predictions": [image]})


class Runway(Vendor):
    """docs.dev.runwayml.com/api: tasks, with the version header on every call."""

    name = "runway"
    version = "2024-11-06"

    def routes(self) -> list[BaseRoute]:
        return [
            route("/v1/text_to_video", self.create, "POST"),
            route("/v1/tasks/{id}", self.task),
            route("/v1/tasks/{id}", self.cancel, "DELETE"),
            route("/files/{id}.mp4", self.file),
        ]

    def authorized(self, request: Request) -> bool:
        return super().authorized(request) and request.headers.get("x-runway-version") == (
            self.version
        )

    def prompt_of(self, body: Any) -> str:
        return str(body.get("promptText", ""))

    def throttled(self) -> Response:
        return JSONResponse(
            {"error": "You have exceeded the rate limit for this endpoint."},
            status_code=429,
            headers={"Retry-After": str(self.retry_after_s)},
        )

    def task_answer(self, request: Request, job: Job, phase: str) -> dict[str, Any]:
        created = "2025-10-01T12:00:00.000Z"
        estimate = {"estimatedCost": {"credits": 25.0}}
        if phase == "queued":
            return {"id": job.id, "createdAt": created, "status": "PENDING", **estimate}
        if phase == "running":
            return {
                "id": job.id,
                "createdAt": created,
                "status": "RUNNING",
                "progress": 0.4,
                **estimate,
            }
        if phase == "canceled":
            return {
                "id": job.id,
                "createdAt": created,
                "status": "CANCELLED",
                "cost": {"credits": 0},
            }
        if phase == "refused":
            return {
                "id": job.id,
                "createdAt": created,
                "status": "FAILED",
                "failure": "Your prompt did not pass our content moderation.",
                "failureCode": "SAFETY.INPUT.TEXT",
                "cost": {"credits": 0},
            }
        return {
            "id": job.id,
            "createdAt": created,
            "status": "SUCCEEDED",
            "output": [f"{self.base(request)}/files/{job.id}.mp4"],
            "cost": {"credits": 25},
        }

    def job_missing(self) -> Response:
        return not_found("Task not found")

    async def create(self, request: Request) -> Response:
        job = await self.submitted(request, "rw-")
        return JSONResponse({"id": job.id}) if isinstance(job, Job) else job

    async def task(self, request: Request) -> Response:
        return await self.answer(
            request, lambda job: JSONResponse(self.task_answer(request, job, self.phase(job)))
        )

    async def cancel(self, request: Request) -> Response:
        return await self.answer(
            request, lambda job: cancel(job, Response(status_code=204)), keyed=False
        )

    async def file(self, request: Request) -> Response:
        # The output URL is signed and short-lived: no key needed (nor sent).
        return await self.answer(request, lambda job: media(*self.output), keyed=False)


class Luma(Vendor):
    """docs.lumalabs.ai/reference: Dream Machine generations."""

    name = "luma"

    def routes(self) -> list[BaseRoute]:
        return [
            route("/dream-machine/v1/generations", self.create, "POST"),
            route("/dream-machine/v1/generations/{id}", self.get),
            route("/dream-machine/v1/generations/{id}", self.delete, "DELETE"),
            route("/cdn/{id}.mp4", self.file),
        ]

    def throttled(self) -> Response:
        return JSONResponse(
            {"detail": "Too many requests"},
            status_code=429,
            headers={"Retry-After": str(self.retry_after_s)},
        )

    def generation(self, request: Request, job: Job, phase: str) -> dict[str, Any]:
        state = {"queued": "queued", "running": "dreaming", "done": "completed"}.get(
            phase, "failed"
        )
        done = phase == "done"
        return {
            "id": job.id,
            "generation_type": "video",
            "state": state,
            "failure_reason": "400: prompt not allowed because advanced moderation failed"
            if phase == "refused"
            else None,
            "created_at": "2025-10-01T12:00:00.000Z",
            "assets": {"video": f"{self.base(request)}/cdn/{job.id}.mp4"} if done else None,
            "model": job.body.get("model", "ray-2"),
            "request": {
                "generation_type": "video",
                "prompt": job.prompt,
                "model": job.body.get("model", "ray-2"),
                "aspect_ratio": job.body.get("aspect_ratio", "16:9"),
            },
        }

    def job_missing(self) -> Response:
        return JSONResponse({"detail": "Generation not found"}, status_code=404)

    async def create(self, request: Request) -> Response:
        job = await self.submitted(request, "9f0b1c2d-0000-4000-8000-")
        if not isinstance(job, Job):
            return job
        return JSONResponse(self.generation(request, job, "queued"), status_code=201)

    async def get(self, request: Request) -> Response:
        return await self.answer(
            request, lambda job: JSONResponse(self.generation(request, job, self.phase(job)))
        )

    async def delete(self, request: Request) -> Response:
        # Luma answers 204 to a delete of an id it does not know, too.
        await self.answer(request, lambda job: cancel(job, Response()), keyed=False)
        return Response(status_code=204)


class Replicate(Vendor):
    """replicate.com/docs/reference/http: predictions."""

    name = "replicate"
    output = (PNG, "image/webp")

    def routes(self) -> list[BaseRoute]:
        return [
            route("/v1/models/{owner}/{model}/predictions", self.create, "POST"),
            route("/v1/predictions/{id}", self.get),
            route("/v1/predictions/{id}/cancel", self.cancel, "POST"),
            route("/delivery/{id}/out-0.webp", self.file),
        ]

    def prompt_of(self, body: Any) -> str:
        return str(body.get("input", {}).get("prompt", ""))

    def throttled(self) -> Response:
        return JSONResponse(
            {
                "title": "Request was throttled.",
                "detail": "Request was throttled. Expected available in 1 second.",
                "status": 429,
            },
            status_code=429,
            headers={"Retry-After": str(self.retry_after_s)},
        )

    def prediction(self, request: Request, job: Job, phase: str) -> dict[str, Any]:
        status = {
            "queued": "starting",
            "running": "processing",
            "done": "succeeded",
            "refused": "failed",
            "canceled": "canceled",
        }[phase]
        base = self.base(request)
        return {
            "id": job.id,
            "model": "black-forest-labs/flux-schnell",
            "version": "dp-4d0bcc010b3049749a251855f12800be",
            "input": job.body.get("input", {}),
            "logs": "",
            "output": [f"{base}/delivery/{job.id}/out-0.webp"] if phase == "done" else None,
            "data_removed": False,
            "error": "NSFW content detected. Try running it again, or try a different prompt."
            if phase == "refused"
            else None,
            "status": status,
            "created_at": "2025-10-01T12:00:00.000Z",
            "started_at": None if phase == "queued" else "2025-10-01T12:00:01.000Z",
            "completed_at": "2025-10-01T12:00:03.000Z" if phase == "done" else None,
            "metrics": {"predict_time": 1.1} if phase == "done" else {},
            "urls": {
                "cancel": f"{base}/v1/predictions/{job.id}/cancel",
                "get": f"{base}/v1/predictions/{job.id}",
                "web": f"https://replicate.com/p/{job.id}",
            },
        }

    def job_missing(self) -> Response:
        return JSONResponse({"title": "Not found", "status": 404}, status_code=404)

    async def create(self, request: Request) -> Response:
        job = await self.submitted(request, "q9r8")
        if not isinstance(job, Job):
            return job
        # `Prefer: wait` holds the answer until the model is done or the wait
        # ends; this stand-in's model is never that quick, so it answers starting.
        return JSONResponse(self.prediction(request, job, "queued"), status_code=201)

    async def get(self, request: Request) -> Response:
        return await self.answer(
            request, lambda job: JSONResponse(self.prediction(request, job, self.phase(job)))
        )

    async def cancel(self, request: Request) -> Response:
        return await self.answer(
            request,
            lambda job: cancel(job, JSONResponse(self.prediction(request, job, "canceled"))),
            keyed=False,
        )


VENDORS_A = [OpenAI, Gemini, Runway, Luma, Replicate]
