"""The OpenAPI document of the local API, written out rather than generated."""

from __future__ import annotations

from typing import Any

_TASK_BODY = {
    "type": "object",
    "required": ["model"],
    "additionalProperties": False,
    "properties": {
        "model": {"type": "string", "description": "a model name from profiles/"},
        "params": {"type": "object", "description": "prompt and the model's parameters"},
        "force": {"type": "boolean", "description": "bypass de-duplication and the cache"},
        "ref": {
            "type": "string",
            "pattern": "^[A-Za-z0-9_-][A-Za-z0-9._-]{0,99}$",
            "description": "your name for the task, unique within its job; names its files",
        },
    },
}
_JOB_BODY = {
    "type": "object",
    "required": ["name", "tasks"],
    "properties": {"name": {"type": "string"}, "tasks": {"type": "array", "items": _TASK_BODY}},
}
_ERROR = {
    "description": "error",
    "content": {
        "application/json": {
            "schema": {
                "type": "object",
                "properties": {
                    "error": {
                        "type": "object",
                        "properties": {"kind": {"type": "string"}, "message": {"type": "string"}},
                    }
                },
            }
        }
    },
}


def _op(summary: str, body: dict[str, Any] | None = None, ok: str = "200") -> dict[str, Any]:
    op: dict[str, Any] = {
        "summary": summary,
        "responses": {
            ok: {"description": "ok"},
            "400": _ERROR,
            "401": _ERROR,
            "403": _ERROR,
            "404": _ERROR,
            "409": _ERROR,
        },
    }
    if body is not None:
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": body}}}
    return op


_ID = [
    {
        "name": "id",
        "in": "path",
        "required": True,
        "schema": {"type": "string"},
        "description": "the id, or a unique prefix of 4+ characters (409 `ambiguous` with "
        "`error.candidates` when several match)",
    }
]


def _query(name: str, description: str, kind: str = "string") -> dict[str, Any]:
    return {"name": name, "in": "query", "schema": {"type": kind}, "description": description}


_PAGING = [
    _query("limit", "items per page, 1..500 (default 50)", "integer"),
    _query("after", "the `next` of the previous page"),
]
_PAGE = {
    "description": "one page, newest first",
    "content": {
        "application/json": {
            "schema": {
                "type": "object",
                "properties": {
                    "items": {"type": "array", "items": {"type": "object"}},
                    "next": {"type": ["string", "null"], "description": "cursor for `after`"},
                },
            }
        }
    },
}


def _listing(summary: str, filters: list[dict[str, Any]]) -> dict[str, Any]:
    op = _op(summary)
    op["responses"]["200"] = _PAGE
    op["parameters"] = [*filters, *_PAGING]
    return op

_NAME = [{"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}]

OPENAPI: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {"title": "dispatcher local API", "version": "1"},
    "components": {
        "securitySchemes": {
            "bearer": {"type": "http", "scheme": "bearer"},
            "localToken": {"type": "apiKey", "in": "header", "name": "X-Local-Token"},
        }
    },
    "security": [{"bearer": []}, {"localToken": []}],
    "paths": {
        "/v1/tasks": {
            "post": _op("Create a task (de-duplicated unless force)", _TASK_BODY, "201"),
            "get": _listing(
                "Tasks, newest first, paged",
                [
                    _query("state", "comma-separated task states"),
                    _query("model", "a model name"),
                    _query("job", "a job id or unique prefix"),
                    _query("q", "text found in the prompt/params or the ref"),
                ],
            ),
        },
        "/v1/tasks/{id}": {
            "parameters": _ID,
            "get": _op("A task with ahead, eta_s, progress and its `attempts` history"),
        },
        "/v1/tasks/{id}/cancel": {
            "parameters": _ID,
            "post": _op("Cancel a pending or running task"),
        },
        "/v1/tasks/{id}/retry": {"parameters": _ID, "post": _op("Retry a failed task")},
        "/v1/tasks/{id}/result": {
            "parameters": [*_ID, _query("file", "index of the result file (default 0)", "integer")],
            "get": _op("Download a result file, or the text answer as JSON"),
        },
        "/v1/tasks/{id}/artifacts/{attempt}/{name}": {
            "parameters": [
                *_ID,
                {"name": "attempt", "in": "path", "required": True, "schema": {"type": "integer"}},
                {
                    "name": "name",
                    "in": "path",
                    "required": True,
                    "schema": {"enum": ["screenshot.png", "page.html", "trace.zip", "answer.txt"]},
                },
            ],
            "get": _op("What a failed, stalled or canceled attempt left (listed as `artifacts`)"),
        },
        "/v1/jobs": {
            "post": _op("Create a job from a list of tasks", _JOB_BODY, "201"),
            "get": _listing(
                "Jobs with counts, from_cache, finished_at and elapsed_s, newest first, paged",
                [
                    _query("state", "comma-separated: running, success, failed, canceled, partial"),
                    _query("q", "text found in the job's name"),
                ],
            ),
        },
        "/v1/jobs/{id}": {"parameters": _ID, "get": _op("A job with counts, state and tasks")},
        "/v1/jobs/{id}/cancel": {
            "parameters": _ID,
            "post": _op("Cancel pending and running tasks"),
        },
        "/v1/jobs/{id}/retry": {"parameters": _ID, "post": _op("Retry the failed tasks only")},
        "/v1/lanes": {"get": _op("Lanes with concurrency, queue depth and running tasks")},
        "/v1/accounts": {"get": _op("Web accounts and API providers with their switches")},
        "/v1/accounts/{name}/disable": {
            "parameters": _NAME,
            "post": _op(
                "Disable a lane",
                {
                    "type": "object",
                    "required": ["reason"],
                    "properties": {"reason": {"type": "string"}},
                },
            ),
        },
        "/v1/accounts/{name}/enable": {"parameters": _NAME, "post": _op("Enable a lane")},
        "/v1/events": {"get": _op("Server-sent events for every state change")},
        "/v1/webhooks/deliveries": {
            "get": _op("Recent webhook delivery attempts, newest first, with the configured URLs")
        },
        "/v1/dashboard-code": {"post": _op("A one-time code for the dashboard session")},
        "/healthz": {"get": _op("Health, with the process id and the number of lanes")},
        "/livez": {
            "get": {
                "summary": "Liveness for process monitors: no token needed, no data shown",
                "security": [],
                "responses": {"200": {"description": '{"ok": true}'}},
            }
        },
        "/metrics": {"get": _op("Prometheus metrics")},
    },
}
