"""/openapi.json: generated from the models that validate requests, every route in it."""

from __future__ import annotations

from typing import Any, cast

import pytest
from starlette.routing import Route

from dispatcher.accounts import switches as accounts
from dispatcher.errors import InputError
from dispatcher.http import bodies, limits
from dispatcher.http.app import create_app
from dispatcher.http.openapi import OPENAPI, OPERATIONS, UNDOCUMENTED, build_document
from dispatcher.http.security import Credentials
from dispatcher.tasks.spec import parse_job, parse_spec


def _routes() -> set[tuple[str, str]]:
    app = create_app(cast(Any, None), Credentials.fresh()).app
    found = set()
    for route in cast(Any, app).routes:
        assert isinstance(route, Route)
        for method in route.methods or ():
            if method != "HEAD":
                found.add((route.path, method.lower()))
    return found


def test_every_route_is_documented_and_nothing_else() -> None:
    routes = _routes()
    assert routes - UNDOCUMENTED == set(OPERATIONS)
    documented = {(path, method) for path, ops in OPENAPI["paths"].items() for method in ops}
    assert documented == set(OPERATIONS)


def test_every_operation_documents_its_errors() -> None:
    for path, ops in OPENAPI["paths"].items():
        for method, op in ops.items():
            codes = set(op["responses"])
            where = f"{method.upper()} {path}"
            assert {"403", "413"} <= codes, where
            if path not in ("/v1/session", "/livez"):  # the public ones
                assert "401" in codes, where
            if "{" in path:
                assert "404" in codes, where
            if "requestBody" in op or any(p["in"] == "query" for p in op.get("parameters", [])):
                assert "400" in codes, where
            error = op["responses"]["403"]["content"]["application/json"]["schema"]
            assert error == {"$ref": "#/components/schemas/ErrorAnswer"}
    for path in ("/v1/tasks/{id}/cancel", "/v1/tasks/{id}/retry", "/v1/tasks/{id}/result"):
        assert (
            "409" in OPENAPI["paths"][path]["post" if "result" not in path else "get"]["responses"]
        )


def test_request_schemas_are_the_validating_models() -> None:
    schemas = OPENAPI["components"]["schemas"]
    task = schemas["TaskBody"]
    assert task["properties"]["model"]["maxLength"] == bodies.MAX_MODEL_CHARS
    assert task["additionalProperties"] is False and task["required"] == ["model"]
    job = schemas["JobBody"]
    assert job["properties"]["tasks"]["maxItems"] == limits.MAX_JOB_TASKS
    assert job["properties"]["tasks"]["minItems"] == 1
    params = schemas["Params"]
    assert params["properties"]["prompt"] == {"title": "Prompt", "type": "string"}
    parameters = OPENAPI["paths"]["/v1/tasks"]["get"]["parameters"]
    (limit,) = [p for p in parameters if p["name"] == "limit"]
    assert limit["schema"] == {"type": "integer", "minimum": 1, "maximum": 500}
    assert bodies.MAX_REASON_CHARS == accounts.MAX_REASON_CHARS


def test_a_new_route_needs_one_entry() -> None:
    extra = dict(OPERATIONS)
    extra[("/v1/things/{id}", "get")] = OPERATIONS[("/v1/tasks/{id}", "get")]
    doc = build_document(extra)
    op = doc["paths"]["/v1/things/{id}"]["get"]
    assert op["parameters"][0]["name"] == "id" and "404" in op["responses"]


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ([], "task must be a JSON object"),
        ({"model": ""}, "task.model must be a non-empty string"),
        ({"model": 5}, "task.model must be a non-empty string"),
        ({}, "task.model must be a non-empty string"),
        ({"model": "m" * 201}, "task.model must be at most 200 characters"),
        ({"model": "m", "params": "x"}, "task.params must be a JSON object"),
        ({"model": "m", "params": {"prompt": 5}}, "task.params.prompt must be a string"),
        ({"model": "m", "force": "yes"}, "task.force must be true or false"),
        ({"model": "m", "b": 1, "a": 2}, "task has unknown field(s): a, b"),
    ],
)
def test_task_messages_name_the_field(raw: Any, message: str) -> None:
    with pytest.raises(InputError) as caught:
        parse_spec(raw)
    assert str(caught.value) == message


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"name": " ", "tasks": [{"model": "m"}]}, "job.name must be a non-empty string"),
        ({"name": "j", "tasks": []}, "job.tasks must not be empty"),
        ({"name": "j", "tasks": [{"model": "m"}, {"model": ""}]}, "tasks[1].model must be a"),
        ({"name": "j", "tasks": [{"model": "m", "params": {"x": float("nan")}}]}, "tasks[0]"),
        ({"name": "j"}, "job.tasks is required"),
    ],
)
def test_job_messages_name_the_field(raw: Any, message: str) -> None:
    with pytest.raises(InputError) as caught:
        parse_job(raw)
    assert str(caught.value).startswith(message)


def test_parsed_specs_keep_every_param() -> None:
    name, (spec,) = parse_job({"name": " j ", "tasks": [{"model": "m", "params": {"k": [1]}}]})
    assert name == "j" and spec.params == {"k": [1]} and spec.force is False
