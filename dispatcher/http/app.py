"""The local HTTP API (JSON) and the event stream; the app mounts the routes of
the dashboard (`dashboard`), remote logins (`login`) and plans (`planview`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import (
    FileResponse,
    Response,
    StreamingResponse,
)
from starlette.responses import (
    JSONResponse as StarletteJSONResponse,
)
from starlette.routing import Match, Route
from starlette.types import Scope

from dispatcher import strictjson
from dispatcher.errors import (
    AmbiguousId,
    DispatcherError,
    InputError,
    NotFound,
    OnAnotherHost,
    StateConflict,
)
from dispatcher.events import TaskChanged
from dispatcher.hosts.view import hosts_view
from dispatcher.http import bodies
from dispatcher.http.dashboard import dashboard_routes
from dispatcher.http.jobview import job_progress
from dispatcher.http.limits import MAX_LIST
from dispatcher.http.login import login_routes
from dispatcher.http.openapi import OPENAPI
from dispatcher.http.params import cursor_of, is_count, limit_of, page_of, states_of, text_of
from dispatcher.http.planview import plan_routes
from dispatcher.http.security import (
    Credentials,
    RefuseNul,
    SecurityMiddleware,
)
from dispatcher.models import JSON, Job, JobState, State, Task
from dispatcher.profiles import ProfileProblem
from dispatcher.tasks.artifacts import artifact_file, task_artifacts
from dispatcher.tasks.resultpaths import real_path, real_result
from dispatcher.tasks.spec import parse_job, parse_spec
from dispatcher.tasks.states import job_state

if TYPE_CHECKING:
    from dispatcher.service.core import Service

log = logging.getLogger("dispatcher.http")

SSE_KEEPALIVE_S = 15.0
DEFAULT_OUTBOX = 100  # deliveries listed when no limit is asked for
# A round claims in a few milliseconds; one on a very busy host does not
# hold a new job's answer longer than this.
JOB_START_WAIT_S = 1.0
NO_STORE = {"Cache-Control": "no-store"}
# A saved page or vendor answer is data, never a document of our origin: even
# if a browser chose to render one, nothing in it may run or load.
ARTIFACT_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; sandbox",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
}


class JSONResponse(StarletteJSONResponse):
    """Always strict JSON, even for a row an older version stored with NaN in it."""

    def render(self, content: Any) -> bytes:
        return strictjson.dump_bytes(content)


def _error(status: int, kind: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"kind": kind, "message": message}}, status_code=status)


async def _json_body(request: Request) -> Any:
    raw = await request.body()
    if not raw:
        raise InputError("request body is empty; send JSON")
    return strictjson.loads(raw)


class Api:
    def __init__(self, service: Service) -> None:
        self.service = service

    # -- answers ----------------------------------------------------------------
    async def task_answer(
        self, task: Task, *, deduped: bool = False, with_attempts: bool = False
    ) -> JSON:
        answer = self._with_real_paths(task.to_json(), task)
        answer["host"] = task.host
        answer["deduped"] = deduped
        # An unfinished task is late once the clock passes its deadline.
        answer["late"] = task.late_at(self.service.clock.now())
        answer.update(await self.service.scheduler.progress(task))
        if task.state is State.PENDING:
            note = self.service.unloaded_note(task.model)
            if note:
                answer["note"] = note
        if with_attempts:
            answer["attempts"] = [a.to_json() for a in await self.service.ledger.attempts(task)]
        answer["artifacts"] = task_artifacts(self.service.settings.results_dir, task)
        files = bool(task.result and task.result.get("files"))
        answer["result_on_host"] = self._elsewhere(task) if files else None
        return answer

    async def job_answer(self, job_id: str, *, tasks: str = "auto") -> JSON:
        """Counts and aggregate progress; every task only for a small job: a
        10,000-task answer is megabytes, and building it holds the event loop."""
        if tasks not in ("auto", "none"):
            raise InputError("tasks must be auto or none")
        job = await self.service.ledger.get_job(job_id)
        answer = (await self.job_answers([job]))[0]
        answer.update(await job_progress(self.service, job))
        answer["tasks_included"] = tasks == "auto" and answer["total"] <= MAX_LIST
        if answer["tasks_included"]:
            found = await self.service.ledger.job_tasks(job)
            answer["tasks"] = [await self.task_answer(t) for t in found]
        return answer

    async def job_answers(self, jobs: list[Job]) -> list[JSON]:
        summaries = await self.service.ledger.job_summaries(jobs)
        now = self.service.clock.now()
        answers = []
        for job in jobs:
            summary = summaries[job.id]
            state = job_state(summary.counts)
            finished_at = summary.last_finished_at if state is not JobState.RUNNING else None
            answers.append(
                {
                    "id": job.id,
                    "name": job.name,
                    "created_at": job.created_at,
                    "state": state.value,
                    "counts": {s.value: summary.counts.get(s, 0) for s in State},
                    "total": sum(summary.counts.values()),
                    "from_cache": summary.from_cache,
                    "cost_usd": round(summary.cost_usd, 6),
                    "late": summary.late,
                    "finished_at": finished_at,
                    "elapsed_s": max(0.0, (finished_at or now) - job.created_at),
                }
            )
        return answers

    # -- tasks -------------------------------------------------------------------
    async def create_task(self, request: Request) -> Response:
        spec = parse_spec(await _json_body(request))
        submitted = await self.service.ledger.submit(spec)
        status = 200 if submitted.deduped else 201
        answer = await self.task_answer(submitted.task, deduped=submitted.deduped)
        return JSONResponse(answer, status)

    async def list_tasks(self, request: Request) -> Response:
        """Tasks newest first, filtered, one page at a time (`?limit=&after=`)."""
        ledger = self.service.ledger
        limit = limit_of(request, 50)
        job = request.query_params.get("job")
        order = request.query_params.get("order", "newest")
        if order not in ("newest", "oldest"):
            raise InputError("order must be newest or oldest")
        oldest = order == "oldest"  # waiting tasks oldest first: the next to run
        tasks = await ledger.list_tasks(
            states=states_of(request, State),
            model=request.query_params.get("model") or None,
            job_id=(await ledger.get_job(job)).id if job else None,
            text=text_of(request, "q"),
            before_seq=None if oldest else cursor_of(request),
            after_seq=cursor_of(request) if oldest else None,
            oldest_first=oldest,
            limit=limit + 1,
        )
        page = page_of([await self.task_answer(t) for t in tasks], [t.seq for t in tasks], limit)
        return JSONResponse(page)

    async def get_task(self, request: Request) -> Response:
        task = await self.service.ledger.get(request.path_params["id"])
        return JSONResponse(await self.task_answer(task, with_attempts=True))

    async def cancel_task(self, request: Request) -> Response:
        task = await self.service.ledger.request_cancel(request.path_params["id"])
        return JSONResponse(await self.task_answer(task))

    async def retry_task(self, request: Request) -> Response:
        task = await self.service.ledger.retry(request.path_params["id"])
        return JSONResponse(await self.task_answer(task))

    async def task_result(self, request: Request) -> Response:
        task = await self.service.ledger.get(request.path_params["id"])
        if task.state is not State.SUCCESS or not task.result:
            raise StateConflict(f"task {task.id} has no result yet (state {task.state.value})")
        files = task.result.get("files") or []
        index_raw = request.query_params.get("file", "0")
        if not files:
            return JSONResponse({"text": task.result.get("text")})
        if not is_count(index_raw) or int(index_raw) >= len(files):
            raise InputError(f"file must be an index below {len(files)}")
        meta = files[int(index_raw)]
        path = real_path(str(meta["path"]), self.service.settings.results_dir, task.id)
        self._check_here(task)
        if not await asyncio.to_thread(path.is_file):
            raise NotFound(f"the result file of task {task.id} is gone from disk")
        return FileResponse(path, media_type=meta.get("content_type"), filename=meta.get("name"))

    def _with_real_paths(self, answer: JSON, task: Task) -> JSON:
        """The task's answer with its result files where they are on this disk."""
        if task.result:
            answer["result"] = real_result(task.result, self.service.settings.results_dir, task.id)
        return answer

    def _elsewhere(self, task: Task) -> str | None:
        """The host whose disk holds the task's files when this one cannot
        serve them. Result files live on the disk of the host that made them;
        this one serves another host's only from a shared results dir."""
        settings = self.service.settings
        if task.host is None or task.host == settings.host_id or settings.shared_results_dir:
            return None
        return task.host

    def _check_here(self, task: Task) -> None:
        """No proxying: the local API listens on loopback only, so hosts
        cannot reach each other, only the database."""
        host = self._elsewhere(task)
        if host is not None:
            raise OnAnotherHost(
                f"the result files of task {task.id} are on host {host!r}; ask the "
                f"dispatcher there (or give every host one DISPATCHER_SHARED_RESULTS_DIR)",
                host,
            )

    async def task_artifact(self, request: Request) -> Response:
        """A failed attempt's screenshot, page HTML (as text), trace or vendor answer."""
        task = await self.service.ledger.get(request.path_params["id"])
        attempt, name = request.path_params["attempt"], request.path_params["name"]
        path, kind = await asyncio.to_thread(
            artifact_file, self.service.settings.results_dir, task.id, attempt, name
        )
        return FileResponse(
            path,
            media_type=kind.content_type,
            filename=f"{task.id[:8]}-attempt-{attempt}-{kind.name}",
            content_disposition_type="attachment" if kind.download else "inline",
            headers=ARTIFACT_HEADERS,
        )

    # -- jobs --------------------------------------------------------------------
    async def create_job(self, request: Request) -> Response:
        name, specs = parse_job(await _json_body(request))
        job, _ = await self.service.ledger.create_job(name, specs)
        # Its first tasks start before the answer is built (every task's view
        # and ETA: milliseconds of the loop they would otherwise wait).
        await self.service.scheduler.started_what_it_can(JOB_START_WAIT_S)
        return JSONResponse(await self.job_answer(job.id), status_code=201)

    async def list_jobs(self, request: Request) -> Response:
        """Jobs newest first, without their tasks, one page at a time."""
        limit = limit_of(request, 50)
        jobs = await self.service.ledger.list_jobs(
            states=states_of(request, JobState),
            text=text_of(request, "q"),
            before_seq=cursor_of(request),
            limit=limit + 1,
        )
        return JSONResponse(page_of(await self.job_answers(jobs), [j.seq for j in jobs], limit))

    async def get_job(self, request: Request) -> Response:
        tasks = request.query_params.get("tasks", "auto")
        return JSONResponse(await self.job_answer(request.path_params["id"], tasks=tasks))

    async def job_tasks(self, request: Request) -> Response:
        """A job's tasks in job order, one page at a time (`?state=&ref=&cursor=&limit=`)."""
        ledger = self.service.ledger
        limit = limit_of(request, 50)
        job = await ledger.get_job(request.path_params["id"])
        tasks = await ledger.list_tasks(
            states=states_of(request, State),
            job_id=job.id,
            ref=text_of(request, "ref"),
            after_seq=cursor_of(request, "cursor"),
            oldest_first=True,
            limit=limit + 1,
        )
        page = page_of([await self.task_answer(t) for t in tasks], [t.seq for t in tasks], limit)
        return JSONResponse(page)

    async def cancel_job(self, request: Request) -> Response:
        await self.service.ledger.cancel_job(request.path_params["id"])
        return JSONResponse(await self.job_answer(request.path_params["id"]))

    async def retry_job(self, request: Request) -> Response:
        await self.service.ledger.retry_job(request.path_params["id"])
        return JSONResponse(await self.job_answer(request.path_params["id"]))

    # -- lanes and accounts ------------------------------------------------------
    async def lanes(self, request: Request) -> Response:
        return JSONResponse(
            await self.service.scheduler.lanes_view()
            + self.service.refused_lanes()
            + self._invalid_lanes()
        )

    def _invalid_lanes(self) -> list[JSON]:
        """One entry per invalid profile file, so lists show it beside the lanes."""
        by_file: dict[str, list[ProfileProblem]] = {}
        for problem in self.service.profile_problems:
            by_file.setdefault(problem.file, []).append(problem)
        entries: list[JSON] = []
        for file, problems in by_file.items():
            models = sorted({p.model for p in problems if p.model})
            why = "; ".join(f"`{p.key}`: {p.why}" for p in problems)
            entries.append(
                {
                    "name": f"invalid:{Path(file).name}",
                    "kind": None,
                    "owner": "",
                    "models": models,
                    "concurrency": 0,
                    "enabled": False,
                    "needs_attention": False,
                    "reason": f"profile {file}: {why}",
                    "invalid": f"profile {file}: {why}",
                    "queued": 0,
                    "running": [],
                }
            )
        return entries

    async def queues(self, request: Request) -> Response:
        """Waiting tasks per queue, on every host: counts, never the tasks."""
        counts = await self.service.ledger.queued_counts()
        return JSONResponse([{"queue": q, "waiting": n} for q, n in sorted(counts.items())])

    async def reload(self, request: Request) -> Response:
        return JSONResponse(await self.service.reload())

    async def hosts(self, request: Request) -> Response:
        service = self.service
        return JSONResponse(
            await hosts_view(
                service.store,
                me=service.settings.host_id,
                now=service.clock.now(),
                stale_s=service.hosts.stale_s,
            )
        )

    async def accounts(self, request: Request) -> Response:
        return JSONResponse(self.service.accounts.views())

    async def disable_account(self, request: Request) -> Response:
        body = await _json_body(request)
        bodies.validate(bodies.DisableBody, body, "body")
        account = await self.service.accounts.disable(request.path_params["name"], body["reason"])
        return JSONResponse(self.service.accounts.view(account))

    async def add_account(self, request: Request) -> Response:
        body = await _json_body(request)
        bodies.validate(bodies.AccountBody, body, "body")
        return JSONResponse(await self.service.roster.add(body["name"], body["models"]), 201)

    async def remove_account(self, request: Request) -> Response:
        drain = request.query_params.get("drain", "false")
        if drain not in ("true", "false"):
            raise InputError("drain must be true or false")
        answer = await self.service.roster.remove(
            request.path_params["name"], drain=drain == "true"
        )
        return JSONResponse(answer, 202 if answer["draining"] else 200)

    async def enable_account(self, request: Request) -> Response:
        name = request.path_params["name"]
        # Keys are read again before the lane opens (else its first request
        # could go out keyless and be refused), and after: an account enabled
        # without its key is marked again.
        await self.service.check_api_keys()
        await self.service.accounts.enable(name)
        await self.service.check_api_keys()
        return JSONResponse(self.service.accounts.view(self.service.accounts.get(name)))

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
                    data = event.to_json()
                    if isinstance(event, TaskChanged):
                        self._with_real_paths(data["task"], event.task)
                    yield f"event: {data['type']}\ndata: {strictjson.dumps(data)}\n\n".encode()

        return StreamingResponse(
            stream(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    async def webhook_deliveries(self, request: Request) -> Response:
        return JSONResponse(await self.service.webhooks.deliveries_view())

    async def webhook_outbox(self, request: Request) -> Response:
        state = request.query_params.get("state") or None
        return JSONResponse(
            await self.service.webhooks.outbox_view(state, limit_of(request, DEFAULT_OUTBOX))
        )

    async def webhook_redeliver(self, request: Request) -> Response:
        return JSONResponse(await self.service.webhooks.redeliver(request.path_params["id"]))

    async def healthz(self, request: Request) -> Response:
        return JSONResponse(
            {
                "ok": True,
                "service": "dispatcher",
                "pid": self.service.pid,
                "lanes": len(self.service.scheduler.lanes),
            }
        )

    async def livez(self, request: Request) -> Response:
        """For process monitors: no token, and nothing to read but "alive"."""
        return JSONResponse({"ok": True}, headers=NO_STORE)

    async def openapi(self, request: Request) -> Response:
        return JSONResponse(OPENAPI)

    async def metrics(self, request: Request) -> Response:
        body, content_type = await self.service.metrics_payload()
        return Response(body, media_type=content_type)


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
        if isinstance(exc, AmbiguousId):
            return JSONResponse(
                {
                    "error": {
                        "kind": "ambiguous",
                        "message": str(exc),
                        "candidates": exc.candidates,
                    }
                },
                status_code=409,
            )
        if isinstance(exc, NotFound):
            return _error(404, "not_found", str(exc))
        if isinstance(exc, InputError):
            return _error(400, "invalid", str(exc))
        if isinstance(exc, OnAnotherHost):
            return JSONResponse(
                {"error": {"kind": "on_another_host", "message": str(exc), "host": exc.host}},
                status_code=409,
            )
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
        Route("/v1/tasks/{id}/artifacts/{attempt}/{name}", api.task_artifact, methods=["GET"]),
        Route("/v1/jobs", api.create_job, methods=["POST"]),
        Route("/v1/jobs", api.list_jobs, methods=["GET"]),
        Route("/v1/jobs/{id}", api.get_job, methods=["GET"]),
        Route("/v1/jobs/{id}/tasks", api.job_tasks, methods=["GET"]),
        Route("/v1/jobs/{id}/cancel", api.cancel_job, methods=["POST"]),
        Route("/v1/jobs/{id}/retry", api.retry_job, methods=["POST"]),
        Route("/v1/lanes", api.lanes, methods=["GET"]),
        Route("/v1/queues", api.queues, methods=["GET"]),
        Route("/v1/reload", api.reload, methods=["POST"]),
        Route("/v1/hosts", api.hosts, methods=["GET"]),
        Route("/v1/accounts", api.accounts, methods=["GET"]),
        Route("/v1/accounts", api.add_account, methods=["POST"]),
        Route("/v1/accounts/{name}", api.remove_account, methods=["DELETE"]),
        Route("/v1/accounts/{name}/disable", api.disable_account, methods=["POST"]),
        Route("/v1/accounts/{name}/enable", api.enable_account, methods=["POST"]),
        *login_routes(service),
        *plan_routes(service),
        Route("/v1/events", api.events, methods=["GET"]),
        Route("/v1/webhooks/deliveries", api.webhook_deliveries, methods=["GET"]),
        Route("/v1/webhooks/outbox", api.webhook_outbox, methods=["GET"]),
        Route("/v1/webhooks/outbox/{id}/redeliver", api.webhook_redeliver, methods=["POST"]),
        Route("/healthz", api.healthz, methods=["GET"]),
        Route("/metrics", api.metrics, methods=["GET"]),
        Route("/livez", api.livez, methods=["GET"]),
        Route("/openapi.json", api.openapi, methods=["GET"]),
        *dashboard_routes(service),
    ]
    app = Starlette(
        routes=routes,
        middleware=[Middleware(RefuseNul)],
        exception_handlers={DispatcherError: on_dispatcher_error, HTTPException: on_http_error},
    )
    return SecurityMiddleware(app, credentials)
