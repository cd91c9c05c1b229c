"""The local HTTP API (JSON), the event stream, and the dashboard's files."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import (
    FileResponse,
    HTMLResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.responses import (
    JSONResponse as StarletteJSONResponse,
)
from starlette.routing import Match, Route
from starlette.types import Scope

from dispatcher import strictjson
from dispatcher.errors import DispatcherError, InputError, NotFound, StateConflict
from dispatcher.http import bodies
from dispatcher.http.openapi import MAX_LIST, OPENAPI
from dispatcher.http.security import SESSION_COOKIE, SESSION_TTL_S, Credentials, SecurityMiddleware
from dispatcher.models import JSON, State, Task
from dispatcher.states import job_state
from dispatcher.taskspec import parse_job, parse_spec

if TYPE_CHECKING:
    from dispatcher.service import Service

log = logging.getLogger("dispatcher.http")

STATIC_DIR = Path(__file__).resolve().parent / "static"
STATIC_FILES = frozenset({"dashboard.js", "dashboard.css"})
SSE_KEEPALIVE_S = 15.0
# The dashboard runs only its own script and talks only to this origin.
PAGE_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


class JSONResponse(StarletteJSONResponse):
    """Always strict JSON, even for a row an older version stored with NaN in it."""

    def render(self, content: Any) -> bytes:
        return strictjson.dump_bytes(content)


def _error(status: int, kind: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"kind": kind, "message": message}}, status_code=status)


def _is_count(raw: str) -> bool:
    """ASCII digits only: str.isdigit() also takes "²", which int() refuses."""
    return raw.isascii() and raw.isdigit() and len(raw) <= 9


def _limit(request: Request, default: int) -> int:
    raw = request.query_params.get("limit", str(default))
    if not _is_count(raw) or not 1 <= int(raw) <= MAX_LIST:
        raise InputError(f"limit must be a whole number within 1..{MAX_LIST}")
    return int(raw)


async def _json_body(request: Request) -> Any:
    raw = await request.body()
    if not raw:
        raise InputError("request body is empty; send JSON")
    return strictjson.loads(raw)


class Api:
    def __init__(self, service: Service) -> None:
        self.service = service

    # -- answers ----------------------------------------------------------------
    def task_answer(self, task: Task, *, deduped: bool = False) -> JSON:
        answer = task.to_json()
        answer["deduped"] = deduped
        answer.update(self.service.scheduler.progress(task))
        return answer

    def job_answer(self, job_id: str, *, with_tasks: bool = True) -> JSON:
        ledger = self.service.ledger
        job = ledger.get_job(job_id)
        counts = ledger.store.job_counts(job_id)
        answer: JSON = {
            "id": job.id,
            "name": job.name,
            "created_at": job.created_at,
            "state": job_state(counts).value,
            "counts": {state.value: counts.get(state, 0) for state in State},
            "total": sum(counts.values()),
        }
        if with_tasks:
            answer["tasks"] = [self.task_answer(t) for t in ledger.store.job_tasks(job_id)]
        return answer

    # -- tasks -------------------------------------------------------------------
    async def create_task(self, request: Request) -> Response:
        spec = parse_spec(await _json_body(request))
        submitted = await self.service.ledger.submit(spec)
        self.service.scheduler.wake()
        status = 200 if submitted.deduped else 201
        return JSONResponse(self.task_answer(submitted.task, deduped=submitted.deduped), status)

    async def list_tasks(self, request: Request) -> Response:
        """Tasks in the given states (`?state=running,pending`), oldest first."""
        raw = request.query_params.get("state", "running,pending")
        try:
            wanted = [State(name.strip()) for name in raw.split(",") if name.strip()]
        except ValueError as exc:
            raise InputError(
                f"state must be a comma-separated list of {', '.join(s.value for s in State)}"
            ) from exc
        limit = _limit(request, 200)
        tasks: list[Task] = []
        for state in dict.fromkeys(wanted):
            tasks += self.service.ledger.store.tasks_in_state(state, limit=limit - len(tasks))
            if len(tasks) >= limit:
                break
        return JSONResponse([self.task_answer(t) for t in tasks])

    async def get_task(self, request: Request) -> Response:
        return JSONResponse(self.task_answer(self.service.ledger.get(request.path_params["id"])))

    async def cancel_task(self, request: Request) -> Response:
        task = self.service.ledger.request_cancel(request.path_params["id"])
        self.service.scheduler.notify_cancel(task.id)
        return JSONResponse(self.task_answer(task))

    async def retry_task(self, request: Request) -> Response:
        task = self.service.ledger.retry(request.path_params["id"])
        self.service.scheduler.wake()
        return JSONResponse(self.task_answer(task))

    async def task_result(self, request: Request) -> Response:
        task = self.service.ledger.get(request.path_params["id"])
        if task.state is not State.SUCCESS or not task.result:
            raise StateConflict(f"task {task.id} has no result yet (state {task.state.value})")
        files = task.result.get("files") or []
        index_raw = request.query_params.get("file", "0")
        if not files:
            return JSONResponse({"text": task.result.get("text")})
        if not _is_count(index_raw) or int(index_raw) >= len(files):
            raise InputError(f"file must be an index below {len(files)}")
        meta = files[int(index_raw)]
        path = Path(meta["path"])
        if not await asyncio.to_thread(path.is_file):
            raise NotFound(f"the result file of task {task.id} is gone from disk")
        return FileResponse(path, media_type=meta.get("content_type"), filename=meta.get("name"))

    # -- jobs --------------------------------------------------------------------
    async def create_job(self, request: Request) -> Response:
        name, specs = parse_job(await _json_body(request))
        job, _ = await self.service.ledger.create_job(name, specs)
        self.service.scheduler.wake()
        return JSONResponse(self.job_answer(job.id), status_code=201)

    async def list_jobs(self, request: Request) -> Response:
        jobs = self.service.ledger.store.list_jobs(limit=_limit(request, 50))
        return JSONResponse([self.job_answer(j.id, with_tasks=False) for j in jobs])

    async def get_job(self, request: Request) -> Response:
        return JSONResponse(self.job_answer(request.path_params["id"]))

    async def cancel_job(self, request: Request) -> Response:
        changed = self.service.ledger.cancel_job(request.path_params["id"])
        for task in changed:
            self.service.scheduler.notify_cancel(task.id)
        return JSONResponse(self.job_answer(request.path_params["id"]))

    async def retry_job(self, request: Request) -> Response:
        self.service.ledger.retry_job(request.path_params["id"])
        self.service.scheduler.wake()
        return JSONResponse(self.job_answer(request.path_params["id"]))

    # -- lanes and accounts ------------------------------------------------------
    async def lanes(self, request: Request) -> Response:
        return JSONResponse(self.service.scheduler.lanes_view())

    async def accounts(self, request: Request) -> Response:
        return JSONResponse([a.to_json() for a in self.service.accounts.all()])

    async def disable_account(self, request: Request) -> Response:
        body = await _json_body(request)
        bodies.validate(bodies.DisableBody, body, "body")
        account = self.service.accounts.disable(request.path_params["name"], body["reason"])
        return JSONResponse(account.to_json())

    async def enable_account(self, request: Request) -> Response:
        account = self.service.accounts.enable(request.path_params["name"])
        self.service.scheduler.wake()
        return JSONResponse(account.to_json())

    # -- live and meta -------------------------------------------------------------
    async def events(self, request: Request) -> Response:
        bus = self.service.events

        async def stream() -> AsyncIterator[bytes]:
            async with bus.subscribe() as queue:
                yield b": connected\n\n"
                while True:
                    try:
                        event = await asyncio.wait_for(queue.get(), timeout=SSE_KEEPALIVE_S)
                    except TimeoutError:
                        yield b": keep-alive\n\n"
                        continue
                    if event is None:
                        return
                    yield f"event: {event['type']}\ndata: {strictjson.dumps(event)}\n\n".encode()

        return StreamingResponse(
            stream(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    async def healthz(self, request: Request) -> Response:
        return JSONResponse(
            {"ok": True, "service": "dispatcher", "pid": self.service.pid,
             "lanes": len(self.service.scheduler.lanes)}
        )

    async def openapi(self, request: Request) -> Response:
        return JSONResponse(OPENAPI)

    async def metrics(self, request: Request) -> Response:
        body, content_type = self.service.metrics_payload()
        return Response(body, media_type=content_type)

    async def session(self, request: Request) -> Response:
        """Trade a one-time code from `dispatcher dashboard` for a session cookie."""
        code = request.query_params.get("code", "")
        session = self.service.credentials.redeem_code(code) if code else None
        if session is None:
            message = ("the dashboard code is unknown, used or expired; "
                       "run `python -m dispatcher dashboard` for a new one")
            if "text/html" in request.headers.get("accept", ""):
                return HTMLResponse(
                    f"<!doctype html><title>dispatcher</title><p>{message}</p>",
                    status_code=403, headers=PAGE_HEADERS,
                )
            return _error(403, "forbidden", message)
        # The code leaves the address bar at once; the cookie is out of scripts' reach.
        response = RedirectResponse(
            "/", status_code=303,
            headers={"Referrer-Policy": "no-referrer", "Cache-Control": "no-store"},
        )
        response.set_cookie(
            SESSION_COOKIE, session, max_age=int(SESSION_TTL_S), httponly=True,
            samesite="strict", path="/",
        )
        return response

    async def issue_code(self, request: Request) -> Response:
        return JSONResponse({"code": self.service.credentials.issue_code()})

    async def dashboard(self, request: Request) -> Response:
        return FileResponse(STATIC_DIR / "dashboard.html", media_type="text/html",
                            headers=PAGE_HEADERS)

    async def static(self, request: Request) -> Response:
        name = request.path_params["name"]
        path = STATIC_DIR / name
        if name not in STATIC_FILES or not path.is_file():
            raise NotFound(f"no static file {name!r}")
        return FileResponse(path, headers={"Cache-Control": "no-cache",
                                           "X-Content-Type-Options": "nosniff"})


def _allowed_methods(routes: list[Route], scope: Scope) -> str:
    probe = {**scope, "method": ""}
    methods: set[str] = set()
    for route in routes:
        match, _ = route.matches(probe)
        if match is not Match.NONE:
            methods |= route.methods or set()
    return ", ".join(sorted(methods))


def create_app(service: Service, credentials: Credentials) -> SecurityMiddleware:
    api = Api(service)

    async def on_dispatcher_error(request: Request, exc: Exception) -> Response:
        if isinstance(exc, NotFound):
            return _error(404, "not_found", str(exc))
        if isinstance(exc, InputError):
            return _error(400, "invalid", str(exc))
        if isinstance(exc, StateConflict):
            return _error(409, "conflict", str(exc))
        log.exception("request failed: %s", request.url.path)
        return _error(500, "internal", str(exc))

    async def on_http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        response = _error(exc.status_code, "http", str(exc.detail))
        response.headers.update(exc.headers or {})
        if exc.status_code == 405:
            # Starlette names only the methods of the one Route it tried; a
            # path served by several Routes (GET and POST /v1/tasks) has more.
            response.headers["Allow"] = _allowed_methods(routes, request.scope)
        return response

    routes = [
        Route("/v1/tasks", api.create_task, methods=["POST"]),
        Route("/v1/tasks", api.list_tasks, methods=["GET"]),
        Route("/v1/tasks/{id}", api.get_task, methods=["GET"]),
        Route("/v1/tasks/{id}/cancel", api.cancel_task, methods=["POST"]),
        Route("/v1/tasks/{id}/retry", api.retry_task, methods=["POST"]),
        Route("/v1/tasks/{id}/result", api.task_result, methods=["GET"]),
        Route("/v1/jobs", api.create_job, methods=["POST"]),
        Route("/v1/jobs", api.list_jobs, methods=["GET"]),
        Route("/v1/jobs/{id}", api.get_job, methods=["GET"]),
        Route("/v1/jobs/{id}/cancel", api.cancel_job, methods=["POST"]),
        Route("/v1/jobs/{id}/retry", api.retry_job, methods=["POST"]),
        Route("/v1/lanes", api.lanes, methods=["GET"]),
        Route("/v1/accounts", api.accounts, methods=["GET"]),
        Route("/v1/accounts/{name}/disable", api.disable_account, methods=["POST"]),
        Route("/v1/accounts/{name}/enable", api.enable_account, methods=["POST"]),
        Route("/v1/events", api.events, methods=["GET"]),
        Route("/v1/dashboard-code", api.issue_code, methods=["POST"]),
        Route("/v1/session", api.session, methods=["GET"]),
        Route("/healthz", api.healthz, methods=["GET"]),
        Route("/metrics", api.metrics, methods=["GET"]),
        Route("/openapi.json", api.openapi, methods=["GET"]),
        Route("/", api.dashboard, methods=["GET"]),
        Route("/static/{name}", api.static, methods=["GET"]),
    ]
    app = Starlette(
        routes=routes,
        exception_handlers={DispatcherError: on_dispatcher_error, HTTPException: on_http_error},
    )
    return SecurityMiddleware(app, credentials)
