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


_ID = [{"name": "id", "in": "path", "required": True, "schema": {"type": "string"}}]
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
            "get": {
                **_op("Tasks in some states, oldest first (?state=running,pending&limit=200)"),
                "parameters": [
                    {"name": "state", "in": "query", "schema": {"type": "string"}},
                    {"name": "limit", "in": "query", "schema": {"type": "integer"}},
                ],
            },
        },
        "/v1/tasks/{id}": {"parameters": _ID, "get": _op("A task with ahead, eta_s, progress")},
        "/v1/tasks/{id}/cancel": {
            "parameters": _ID,
            "post": _op("Cancel a pending or running task"),
        },
        "/v1/tasks/{id}/retry": {"parameters": _ID, "post": _op("Retry a failed task")},
        "/v1/tasks/{id}/result": {"parameters": _ID, "get": _op("Download a result file or text")},
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
            "get": _op("Recent jobs with their progress"),
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
        "/v1/dashboard-code": {"post": _op("A one-time code for the dashboard session")},
        "/healthz": {"get": _op("Liveness")},
        "/metrics": {"get": _op("Prometheus metrics")},
    },
}
