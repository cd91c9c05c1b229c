"""The OpenAPI document of the local API, generated from pydantic models.

Request schemas are the models that validate requests
(`dispatcher.http.bodies`), so the document states the bounds the server
enforces; answer schemas are the models of `answers.py`, which mirror what
`Api` returns. Every operation documents each error it can answer with: 403 for a
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
from typing import Any

from pydantic import BaseModel, TypeAdapter
from pydantic.json_schema import JsonSchemaMode, models_json_schema

from dispatcher.http.answers import (
    AccountAnswer,
    AddedAccount,
    DashboardCode,
    Deliveries,
    ErrorAnswer,
    Health,
    HostAnswer,
    JobAnswer,
    JobPage,
    Lane,
    Live,
    LoginClosed,
    LoginOpened,
    LoginResult,
    Ok,
    Outbox,
    OutboxItem,
    PlanAnswer,
    Queue,
    ReloadAnswer,
    RemovedAccount,
    TaskAnswer,
    TaskPage,
    TextResult,
)
from dispatcher.http.bodies import (
    AccountBody,
    DisableBody,
    ImportBody,
    JobBody,
    LoginInputBody,
    PlanBody,
    TaskBody,
)
from dispatcher.http.limits import MAX_BODY_BYTES, MAX_JOB_BODY_BYTES, MAX_LIST
from dispatcher.models import JobState, State
from dispatcher.tasks.inputfiles import size_text

UNDOCUMENTED = frozenset({("/", "get"), ("/static/{name}", "get")})


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
    ("/v1/plan", "post"): Op(
        "Plan a batch without submitting it: per model and in total, the tasks, "
        "de-duplicated and cached ones, estimated cost and makespan (lower bound named), "
        "which budget would stop it; ok is false when max_cost_usd or deadline cannot be met",
        answer=PlanAnswer,
        body=PlanBody,
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
    ("/v1/queues", "get"): Op("Waiting tasks per queue, on every host", list[Queue]),
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
    limit = MAX_JOB_BODY_BYTES if op.body in (JobBody, PlanBody) else MAX_BODY_BYTES
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
