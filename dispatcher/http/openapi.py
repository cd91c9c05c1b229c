"""The OpenAPI document of the local API, generated from pydantic models.

Request schemas are the models that validate requests
(`dispatcher.http.bodies`), so the document states the bounds the server
enforces; answer schemas are the models below, which mirror what `Api`
returns. Every operation documents each error it can answer with: 403 for a
Host that is not loopback, 413 for a body over 1 MiB (16 MiB for a job), 401/403 for a missing
or wrong token, 400 for bad input, 404 for an unknown id, 409 for a state
conflict. A wrong method gets 405 with an ``Allow`` header (not per
operation).

Adding a route: add the `Route` in `create_app`, then one entry to
`OPERATIONS` keyed by (path, method), for instance::

    ("/v1/things/{id}", "get"): Op("A thing", answer=Thing, errors=(409,)),

`answer` is a pydantic model or type (None for no JSON body); `body` a model
from `dispatcher.http.bodies`; `query` the query parameters. Path parameters
and the errors every route shares (400 with a body or query, 404 with a path
parameter, 401/403/413) are added by `build_document`. A unit test fails
for a route without an entry and for an entry without a route; routes that
are not API (the dashboard page and its files) are listed in
`UNDOCUMENTED`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter
from pydantic.json_schema import JsonSchemaMode, models_json_schema

from dispatcher.http.bodies import (
    AccountBody,
    DisableBody,
    ImportBody,
    JobBody,
    LoginInputBody,
    TaskBody,
)
from dispatcher.http.limits import MAX_BODY_BYTES, MAX_JOB_BODY_BYTES
from dispatcher.inputfiles import size_text
from dispatcher.models import JobState, Kind, Stage, State

MAX_LIST = 500
UNDOCUMENTED = frozenset({("/", "get"), ("/static/{name}", "get")})

# -- answers ----------------------------------------------------------------------


class _Answer(BaseModel):
    # Answers may gain fields; clients must ignore the ones they do not know.
    model_config = ConfigDict(extra="allow")


class ErrorDetail(_Answer):
    kind: str = Field(description="not_found, invalid, conflict, unauthorized, forbidden, ...")
    message: str = Field(description="what is wrong, for a person")


# `account` said "web account" in one place and "API provider" in another.
_OLD_OWNER = 'deprecated: the old name of "owner"; removed in 0.2'


class ErrorAnswer(_Answer):
    error: ErrorDetail


class TaskError(_Answer):
    kind: str
    message: str


class ArtifactInfo(_Answer):
    name: str
    kind: str = Field(description="screenshot, html, trace or answer")
    size: int


class AttemptAnswer(_Answer):
    attempt: int
    lane: str | None
    owner: str | None = Field(description="the web account or API provider whose lane ran it")
    account: str | None = Field(deprecated=True, description=_OLD_OWNER)
    outcome: State
    started_at: float | None
    ended_at: float | None
    error: TaskError | None
    stage_durations: dict[str, float]


class TaskAnswer(_Answer):
    id: str
    job_id: str | None
    model: str
    kind: Kind
    owner: str | None = Field(description="the web account or API provider whose lane ran it")
    account: str | None = Field(deprecated=True, description=_OLD_OWNER)
    params: dict[str, Any]
    fingerprint: str
    state: State
    stage: Stage | None
    attempt: int
    max_attempts: int
    cancel_requested: bool
    force: bool
    remote_id: str | None
    result: dict[str, Any] | None = Field(description='{"text": ...} and/or {"files": [...]}')
    error: TaskError | None
    from_cache: bool
    created_at: float
    started_at: float | None
    heartbeat_at: float | None
    finished_at: float | None
    stage_durations: dict[str, float]
    deduped: bool = Field(description="true when an identical recent task was returned")
    ahead: int = Field(description="pending tasks before this one in its lanes")
    eta_s: float | None
    progress: float | None
    queue_position: float | None = Field(description="the vendor's queue position, if told")
    ref: str | None = Field(default=None, description="the task's name in its job")
    note: str | None = Field(
        default=None, description="why a pending task waits (its model is not loaded)"
    )
    waiting: str | None = Field(
        default=None,
        description="why a pending task cannot run (every lane serving it is disabled or "
        "needs attention); its eta_s is null then",
    )
    overdue_s: float | None = Field(
        default=None, description="how far a running task is past its estimate"
    )
    host: str | None = Field(
        default=None,
        description="the host that ran its current attempt (and holds its result files)",
    )
    result_on_host: str | None = Field(
        default=None,
        description="the host whose disk holds the result files, when this host cannot "
        "serve them (no shared results dir): ask that host; null when this one serves them",
    )
    artifacts: dict[str, list[ArtifactInfo]] = Field(
        default_factory=dict,
        description="per attempt: what a failed, stalled or canceled attempt left",
    )
    attempts: list[AttemptAnswer] | None = Field(
        default=None, description="the attempt history (GET /v1/tasks/{id} only)"
    )


class TaskPage(_Answer):
    items: list[TaskAnswer]
    next: str | None = Field(description="pass as `after` for the next page; null at the end")


class JobSummary(_Answer):
    id: str
    name: str
    created_at: float
    state: JobState
    counts: dict[str, int]
    total: int
    from_cache: int = Field(default=0, description="tasks completed from the result cache")
    finished_at: float | None = None
    elapsed_s: float | None = None


class JobAnswer(JobSummary):
    by_model: dict[str, dict[str, int]] = Field(
        description="the job's tasks per model and state (every state named)"
    )
    done: int = Field(description="tasks that ended: success, failed or canceled")
    eta_s: float | None = Field(
        description="seconds until the last of its waiting or running tasks should finish; "
        "null when unknown or while they cannot run"
    )
    waiting: str | None = Field(
        description="why its waiting tasks cannot run (every lane disabled or needing "
        "attention), instead of an ETA"
    )
    tasks_included: bool = Field(
        description=f"whether `tasks` is here: only for jobs of at most {MAX_LIST} tasks, "
        "and never with `?tasks=none`; page through a larger job with /v1/jobs/{id}/tasks"
    )
    tasks: list[TaskAnswer] | None = Field(
        default=None, description="every task of the job, in job order, when `tasks_included`"
    )


class JobPage(_Answer):
    items: list[JobSummary]
    next: str | None = Field(description="pass as `after` for the next page; null at the end")


class Deliveries(_Answer):
    urls: list[str]
    queued: int = Field(description="events waiting to be written or sent (retries included)")
    delivering: int = Field(description="deliveries being posted now, on any host")
    failed: int = Field(description="deliveries given up, kept for `redeliver`")
    dropped: int = Field(description="deliveries this process gave up or could not keep")
    items: list[dict[str, Any]] = Field(description="recent delivery attempts, newest first")


class OutboxItem(_Answer):
    id: str = Field(description="the delivery (one event to one receiver)")
    event: str
    event_id: str = Field(description="the X-Dispatcher-Delivery header")
    url: str
    state: Literal["pending", "delivering", "failed"]
    attempts: int
    next_at: float
    host: str | None = Field(description="the host posting it now")
    last_status: int | None
    last_error: str | None
    created_at: float
    updated_at: float


class Outbox(_Answer):
    items: list[OutboxItem] = Field(description="newest first")


class Queue(_Answer):
    queue: str = Field(description="a lane group: the queue its lanes take tasks from")
    waiting: int


class Live(_Answer):
    ok: bool


AccountStateName = Literal["ok", "cooldown", "needs_attention", "disabled"]


class Lane(_Answer):
    name: str = Field(description='"web:<account>", "api:<provider>", or "invalid:<file>"')
    kind: Kind | None = Field(description="null for a profile file that is invalid")
    owner: str = Field(description="the web account or API provider this lane belongs to")
    account: str = Field(deprecated=True, description=_OLD_OWNER)
    models: list[str]
    concurrency: int
    effective_concurrency: int = Field(
        description="the quota, halved while 429s without Retry-After storm"
    )
    enabled: bool
    needs_attention: bool
    state: AccountStateName
    until: float | None
    reason: str | None
    queued: int
    running: list[str]
    invalid: str | None = Field(
        default=None,
        description="an invalid profile file: every problem (file, key, why); "
        "its model refuses tasks until it is fixed and reloaded",
    )


class AddedAccount(_Answer):
    name: str
    models: list[str] = Field(description="the web models it serves (besides its profiles')")
    profiles: list[str] = Field(description="profile files that also list it")


class RemovedAccount(_Answer):
    name: str
    removed: bool = Field(description="gone now (false while it drains)")
    draining: bool = Field(description="takes no new task; goes when its running task ends")
    running: list[str]


class ReloadAnswer(_Answer):
    added: list[str]
    removed: list[str]
    changed: list[str]
    refused: dict[str, str] = Field(description="model -> why a restart is needed to apply it")
    invalid_profiles: list[dict[str, Any]] = Field(description="file, key, why, model")
    models: list[str] = Field(description="the models loaded after the reload")
    settings: dict[str, Any] = Field(description="live settings that changed: name -> value")
    settings_error: str | None = Field(description="why the settings were not applied")
    settings_sources: dict[str, list[dict[str, Any]]] = Field(
        default={},
        description="live setting -> where it is set (variable, source, value; secrets "
        "masked), the one used first: for each changed setting and each set in several places",
    )


class AccountAnswer(_Answer):
    name: str
    kind: Kind
    state: AccountStateName = Field(
        description="ok; cooldown (a usage cap, open again at `until`); needs_attention "
        "(`reason` says why); disabled (the operator's switch)"
    )
    until: float | None = Field(description="epoch seconds a cooldown ends; else null")
    enabled: bool
    reason: str | None
    needs_attention: bool
    updated_at: float


class HostAnswer(_Answer):
    host: str
    url: str | None = Field(description="where its local API answered when it started")
    this_host: bool
    state: Literal["alive", "silent", "dead"] = Field(
        description="silent: no beat within the stale bound; dead: declared dead or stopped"
    )
    alive: bool
    started_at: float
    heartbeat_at: float
    silent_s: float
    dead_at: float | None
    accounts: list[str] = Field(description="the web accounts it holds leases on")
    running: int = Field(description="tasks it runs now")


class LoginOpened(_Answer):
    account: str
    browser_pid: int | None
    path: str = Field(description="the dashboard page that shows the browser")


class LoginResult(_Answer):
    logged_in: bool
    account: Any = Field(description="the account (enabled) after a login, else its name")
    requeued: list[str] = Field(default=[], description="tasks back in the queue")
    cookies: int | None = Field(default=None, description="an import: cookies loaded")
    dropped: int | None = Field(
        default=None, description="an import: cookies for other sites, left out"
    )


class LoginClosed(_Answer):
    account: str
    closed: bool


class Ok(_Answer):
    ok: bool


class TextResult(_Answer):
    text: str | None


class Health(_Answer):
    ok: bool
    service: str
    pid: int
    lanes: int


class DashboardCode(_Answer):
    code: str = Field(description="one-time, valid for 2 minutes: /v1/session?code=...")


# -- operations ---------------------------------------------------------------------


@dataclass(frozen=True)
class Query:
    name: str
    schema: dict[str, Any]
    description: str = ""


@dataclass(frozen=True)
class Op:
    summary: str
    answer: Any = None  # a pydantic model or type; None: no JSON schema
    body: type[BaseModel] | None = None
    ok: int = 200
    also_ok: tuple[tuple[int, str], ...] = ()  # more success statuses, same body
    media: str = "application/json"
    query: tuple[Query, ...] = ()
    errors: tuple[int, ...] = ()  # beyond the ones every route shares
    public: bool = False  # reachable without the token


_LIMIT = Query("limit", {"type": "integer", "minimum": 1, "maximum": MAX_LIST}, "how many, at most")
_STATES = "|".join(s.value for s in State)
_STATE = Query(
    "state",
    {"type": "string", "pattern": rf"^\s*({_STATES})?\s*(,\s*({_STATES})?\s*)*$"},
    "comma-separated task states (default: all)",
)
_AFTER = Query("after", {"type": "string", "maxLength": 200}, "the `next` of the previous page")
_JOB_STATES = "|".join(s.value for s in JobState)
_JOB_STATE = Query(
    "state",
    {"type": "string", "pattern": rf"^\s*({_JOB_STATES})?\s*(,\s*({_JOB_STATES})?\s*)*$"},
    "comma-separated job states",
)
_TEXT = {"type": "string", "maxLength": 200}

OPERATIONS: dict[tuple[str, str], Op] = {
    ("/v1/tasks", "post"): Op(
        "Create a task (an identical recent one is returned instead, unless force)",
        answer=TaskAnswer,
        body=TaskBody,
        ok=201,
        also_ok=((200, "an identical recent task, returned instead (deduped: true)"),),
    ),
    ("/v1/tasks", "get"): Op(
        "Tasks, newest first, filtered and paged",
        answer=TaskPage,
        query=(
            _STATE,
            Query("model", _TEXT, "a model name"),
            Query("job", _TEXT, "a job id or unique prefix"),
            Query(
                "order",
                {"type": "string", "enum": ["newest", "oldest"]},
                "newest first (default), or oldest first: waiting tasks in the order they run",
            ),
            Query("q", _TEXT, "text found in the prompt/params or the ref"),
            _LIMIT,
            _AFTER,
        ),
        errors=(404, 409),  # `job` names no job, or is an ambiguous prefix
    ),
    ("/v1/tasks/{id}", "get"): Op(
        "A task (id or unique prefix) with ahead, eta_s, progress and its attempts",
        answer=TaskAnswer,
        errors=(409,),
    ),
    ("/v1/tasks/{id}/artifacts/{attempt}/{name}", "get"): Op(
        "What a failed, stalled or canceled attempt left (listed as `artifacts`)",
        media="image/png, text/plain or application/zip",
        errors=(400, 409),  # an attempt that is not a number, a name that is no artifact
    ),
    ("/v1/tasks/{id}/cancel", "post"): Op(
        "Cancel a pending or running task", answer=TaskAnswer, errors=(409,)
    ),
    ("/v1/tasks/{id}/retry", "post"): Op("Retry a failed task", answer=TaskAnswer, errors=(409,)),
    ("/v1/tasks/{id}/result", "get"): Op(
        "A result file (?file=index) or the result text",
        answer=TextResult,
        media="application/json, or the file's own type",
        query=(Query("file", {"type": "integer", "minimum": 0}, "which file, from 0"),),
        errors=(409,),
    ),
    ("/v1/jobs", "post"): Op(
        "Create a job from a list of tasks (all or nothing)",
        answer=JobAnswer,
        body=JobBody,
        ok=201,
    ),
    ("/v1/jobs", "get"): Op(
        "Jobs with their counts, newest first, filtered and paged",
        answer=JobPage,
        query=(_JOB_STATE, Query("q", _TEXT, "text found in the job's name"), _LIMIT, _AFTER),
    ),
    ("/v1/jobs/{id}", "get"): Op(
        "A job (id or unique prefix): counts, state, progress; its tasks too when small",
        answer=JobAnswer,
        query=(
            Query(
                "tasks",
                {"type": "string", "enum": ["auto", "none"]},
                f"auto (default): the tasks of a job of at most {MAX_LIST}; none: never",
            ),
        ),
        errors=(409,),
    ),
    ("/v1/jobs/{id}/tasks", "get"): Op(
        "A job's tasks in job order, filtered by state and ref, one page at a time",
        answer=TaskPage,
        query=(
            _STATE,
            Query("ref", _TEXT, "text found in the task's ref"),
            Query("cursor", {"type": "string", "maxLength": 200}, "the `next` of the last page"),
            _LIMIT,
        ),
        errors=(409,),
    ),
    ("/v1/jobs/{id}/cancel", "post"): Op(
        "Cancel pending and running tasks", answer=JobAnswer, errors=(409,)
    ),
    ("/v1/jobs/{id}/retry", "post"): Op(
        "Retry the failed tasks only", answer=JobAnswer, errors=(409,)
    ),
    ("/v1/lanes", "get"): Op("Lanes with concurrency, queue depth and running tasks", list[Lane]),
    ("/v1/queues", "get"): Op("Waiting tasks per queue (lane group), on every host", list[Queue]),
    ("/v1/reload", "post"): Op(
        "Re-read the profiles (also SIGHUP); answers what changed", answer=ReloadAnswer
    ),
    ("/v1/hosts", "get"): Op("The hosts sharing the database", answer=list[HostAnswer]),
    ("/v1/accounts", "get"): Op("Web accounts and API providers", answer=list[AccountAnswer]),
    ("/v1/accounts", "post"): Op(
        "Add a web account serving loaded web models; it takes tasks at once",
        answer=AddedAccount,
        body=AccountBody,
        ok=201,
        errors=(409,),
    ),
    ("/v1/accounts/{name}", "delete"): Op(
        "Remove a web account added at run time (409 while it runs a task, unless drain)",
        answer=RemovedAccount,
        also_ok=((202, "draining: removed when its running task ends"),),
        query=(Query("drain", {"type": "string", "enum": ["true", "false"]}, "wait for its task"),),
        errors=(409,),
    ),
    ("/v1/accounts/{name}/disable", "post"): Op(
        "Disable a lane", answer=AccountAnswer, body=DisableBody
    ),
    ("/v1/accounts/{name}/enable", "post"): Op("Enable a lane", answer=AccountAnswer),
    ("/v1/accounts/{name}/login", "post"): Op(
        "Open the account's profile in a browser for a remote login (one at a time)",
        answer=LoginOpened,
        ok=201,
        errors=(409,),
    ),
    ("/v1/accounts/{name}/login/frames", "get"): Op(
        "The login browser's screen as server-sent JPEG frames",
        media="text/event-stream",
        errors=(409,),
    ),
    ("/v1/accounts/{name}/login/input", "post"): Op(
        "Mouse, wheel, key or pasted text into the login browser",
        answer=Ok,
        body=LoginInputBody,
        errors=(409,),
    ),
    ("/v1/accounts/{name}/login/done", "post"): Op(
        "Check the login, close the browser, enable the account, re-queue its logged-out tasks",
        answer=LoginResult,
        errors=(409,),
    ),
    ("/v1/accounts/{name}/login/cancel", "post"): Op(
        "Close the login browser without changes", answer=LoginClosed, errors=(409,)
    ),
    ("/v1/accounts/{name}/import", "post"): Op(
        "Load a storage-state JSON or cookies.txt into the profile and check the login",
        answer=LoginResult,
        body=ImportBody,
        errors=(409,),
    ),
    ("/v1/tasks/{id}/live", "get"): Op(
        "A running web task's screen as server-sent JPEG frames (read-only)",
        media="text/event-stream",
        errors=(409,),
    ),
    ("/v1/events", "get"): Op(
        "Server-sent events for every state change", media="text/event-stream"
    ),
    ("/v1/dashboard-code", "post"): Op(
        "A one-time code for a dashboard session (token only)", answer=DashboardCode
    ),
    ("/v1/session", "get"): Op(
        "Trade a one-time code for a session cookie; redirects to the dashboard",
        ok=303,
        media="",
        query=(
            Query("code", {"type": "string"}, "from POST /v1/dashboard-code"),
            Query("next", {"type": "string"}, "a dashboard page to go to, e.g. /#login/<account>"),
        ),
        public=True,
    ),
    ("/v1/webhooks/deliveries", "get"): Op(
        "Recent webhook delivery attempts, newest first, with the configured URLs",
        answer=Deliveries,
    ),
    ("/v1/webhooks/outbox", "get"): Op(
        "Webhook deliveries not delivered yet or given up, newest first",
        answer=Outbox,
        query=(
            Query(
                "state",
                {"type": "string", "enum": ["pending", "delivering", "failed"]},
                "only these (default: all)",
            ),
            _LIMIT,
        ),
    ),
    ("/v1/webhooks/outbox/{id}/redeliver", "post"): Op(
        "Send a failed webhook delivery again, with a fresh budget of attempts",
        answer=OutboxItem,
        errors=(404, 409),
    ),
    ("/healthz", "get"): Op("Health, with the token", answer=Health),
    ("/livez", "get"): Op("Liveness for process monitors: no token, no data", Live, public=True),
    ("/metrics", "get"): Op("Prometheus metrics", media="text/plain"),
    ("/openapi.json", "get"): Op("This document", answer=dict[str, Any]),
}


# -- the document -------------------------------------------------------------------

_REF = "#/components/schemas/{model}"
_PATH_PARAM = re.compile(r"{(\w+)}")


def _error(description: str, *, html: bool = False) -> dict[str, Any]:
    content: dict[str, Any] = {
        "application/json": {"schema": {"$ref": _REF.format(model="ErrorAnswer")}}
    }
    if html:
        content["text/html"] = {"schema": {"type": "string"}}
    return {"description": description, "content": content}


def _schema(answer: Any, models: dict[str, dict[str, Any]]) -> dict[str, Any]:
    if isinstance(answer, type) and issubclass(answer, BaseModel):
        return {"$ref": _REF.format(model=answer.__name__)}
    schema = TypeAdapter(answer).json_schema(ref_template=_REF, mode="serialization")
    models.update(schema.pop("$defs", {}))
    return schema


def _operation(path: str, op: Op, models: dict[str, dict[str, Any]]) -> dict[str, Any]:
    ok: dict[str, Any] = {"description": "ok"}
    if op.answer is not None:
        ok["content"] = {"application/json": {"schema": _schema(op.answer, models)}}
        if op.media != "application/json":
            ok["content"]["*/*"] = {"schema": {}}
    elif op.media:
        ok["content"] = {op.media: {"schema": {"type": "string"}}}
    responses: dict[str, Any] = {str(op.ok): ok}
    for status, description in op.also_ok:
        responses[str(status)] = {**ok, "description": description}
    if op.body is not None or op.query or 400 in op.errors:
        responses["400"] = _error("bad input: the message names the field")
    if not op.public:
        responses["401"] = _error("no token: send Authorization: Bearer <token>")
    responses["403"] = _error(
        "Host is not a loopback name" + ("" if op.public else ", or the token or session is wrong"),
        html=op.public,
    )
    if _PATH_PARAM.search(path) or 404 in op.errors:
        responses["404"] = _error("no such id")
    if 409 in op.errors:
        responses["409"] = _error("not possible in the current state, or an ambiguous id prefix")
    limit = MAX_JOB_BODY_BYTES if op.body is JobBody else MAX_BODY_BYTES
    responses["413"] = _error(f"request body over {size_text(limit)}")
    doc: dict[str, Any] = {"summary": op.summary, "responses": dict(sorted(responses.items()))}
    parameters = [
        {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
        for name in _PATH_PARAM.findall(path)
    ]
    parameters += [
        {
            "name": q.name,
            "in": "query",
            "required": False,
            "schema": q.schema,
            "description": q.description,
        }
        for q in op.query
    ]
    if parameters:
        doc["parameters"] = parameters
    if op.body is not None:
        doc["requestBody"] = {
            "required": True,
            "content": {
                "application/json": {"schema": {"$ref": _REF.format(model=op.body.__name__)}}
            },
        }
    if op.public:
        doc["security"] = []
    return doc


def build_document(operations: dict[tuple[str, str], Op] = OPERATIONS) -> dict[str, Any]:
    """The OpenAPI 3.1 document for `operations`."""
    named: list[type[BaseModel]] = [ErrorAnswer]
    for op in operations.values():
        for model in (op.body, op.answer):
            if isinstance(model, type) and issubclass(model, BaseModel) and model not in named:
                named.append(model)
    keyed: list[tuple[type[BaseModel], JsonSchemaMode]] = [
        (
            m,
            "validation"
            if m in (TaskBody, JobBody, DisableBody, LoginInputBody, ImportBody)
            else "serialization",
        )
        for m in named
    ]
    _, top = models_json_schema(keyed, ref_template=_REF)
    models: dict[str, dict[str, Any]] = dict(top.get("$defs", {}))
    paths: dict[str, dict[str, Any]] = {}
    for (path, method), op in operations.items():
        paths.setdefault(path, {})[method] = _operation(path, op, models)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "dispatcher local API",
            "version": "1",
            "description": (
                "Loopback only. Bodies are strict JSON (no NaN/Infinity, integers within "
                "64 bits, text without lone surrogates, at most 64 levels deep) of at "
                "most 1 MiB (a job: 16 MiB). A wrong method gets 405 with an Allow header."
            ),
        },
        "components": {
            "schemas": dict(sorted(models.items())),
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "localToken": {"type": "apiKey", "in": "header", "name": "X-Local-Token"},
                "session": {"type": "apiKey", "in": "cookie", "name": "dispatcher_session"},
            },
        },
        "security": [{"bearer": []}, {"localToken": []}, {"session": []}],
        "paths": paths,
    }


OPENAPI: dict[str, Any] = build_document()
