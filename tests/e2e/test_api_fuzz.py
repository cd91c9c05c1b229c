"""Schema-driven fuzzing of every operation in /openapi.json, against a real service.

Schemathesis reads the document the running service serves and sends valid
and invalid requests (bodies, query strings, path ids, headers) for every
operation, with the token. Every answer must be no 5xx and must conform to
the document: its status is documented, its content type is, its body
matches the schema. Bounded by a per-operation example count (about a
minute on a 2-core machine) and derandomized, so a run is repeatable.

Not fuzzed: GET /v1/events, an endless server-sent event stream (no request
to it ever completes); tests/integration/test_core_flow.py and
test_http_strict_json.py cover it.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.core.result import Err, Ok

from dispatcher.http.openapi import OPENAPI
from tests.support.procs import start_service, stop_proc, vendor_and_env

pytestmark = pytest.mark.slow

TIME_SCALE = 0.02
EXAMPLES_PER_OPERATION = 50
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]
TALLY: Counter[str] = Counter()
PER_OPERATION: Counter[str] = Counter()
# What exists, per collection ("tasks", "jobs", "accounts", "codes"), from answers.
KNOWN: dict[str, set[str]] = {"tasks": set(), "jobs": set(), "accounts": set(), "codes": set()}
MODELS = ("demo-chat-api", "demo-video")


def _remember(path: str, response: Any) -> None:
    """Ids, names and codes that exist, for later path and query parameters."""
    if response.status_code not in (200, 201):
        return
    try:
        body = json.loads(response.content)
    except ValueError:
        return  # a result file or metrics text
    collection = path.split("/")[2] if path.startswith("/v1/") else ""
    for item in body if isinstance(body, list) else [body]:
        if not isinstance(item, dict):
            continue
        if collection == "dashboard-code" and isinstance(item.get("code"), str):
            KNOWN["codes"].add(item["code"])
        key = "name" if collection == "accounts" else "id"
        if collection in KNOWN and isinstance(item.get(key), str):
            KNOWN[collection].add(item[key])
        for task in item.get("tasks") or []:
            if isinstance(task, dict) and isinstance(task.get("id"), str):
                KNOWN["tasks"].add(task["id"])


def _use_model(body: Any, model: str) -> None:
    """Name a model the service runs, so that valid bodies create real tasks
    (a random model name only ever earns a 400)."""
    if not isinstance(body, dict):
        return
    if isinstance(body.get("model"), str):
        body["model"] = model
    tasks = body.get("tasks")
    if isinstance(tasks, list):
        for task in tasks:
            _use_model(task, model)


@pytest.fixture(scope="module")
def live_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    tmp = tmp_path_factory.mktemp("fuzz")
    vendor, _, env = vendor_and_env(tmp, MODELS, TIME_SCALE)
    state = tmp / "state"
    try:
        service = start_service(state, env, tmp / "service.log")
        try:
            yield {
                "url": f"http://127.0.0.1:{(state / 'port').read_text().strip()}",
                "token": (state / "token").read_text().strip(),
            }
        finally:
            assert service.terminate() == 0, service.log()[-3000:]
    finally:
        stop_proc(vendor)
    summary = Path(tmp / "fuzz-summary.json")
    summary.write_text(json.dumps({"total": TALLY, "per_operation": PER_OPERATION}, indent=1))
    print(f"\nfuzz: {dict(TALLY)} ({summary})")


@pytest.fixture(scope="module")
def served_document(live_service: dict[str, str]) -> dict[str, Any]:
    response = httpx.get(
        f"{live_service['url']}/openapi.json",
        headers={"Authorization": f"Bearer {live_service['token']}"},
    )
    response.raise_for_status()
    return dict(response.json())


# The operations are known when tests are collected: the generated document
# (the served one is checked to be the same, below).
def _operation(result: Ok[Any] | Err[Any]) -> Any:
    """The operation; a part of the document schemathesis cannot read fails collection."""
    if isinstance(result, Err):
        raise result.err()
    return result.ok()


OPERATIONS = [
    _operation(result)
    for result in schemathesis.openapi.from_dict(OPENAPI)
    .exclude(path="/v1/events")
    .get_all_operations()
]


def test_the_served_document_is_the_generated_one(served_document: dict[str, Any]) -> None:
    assert served_document == json.loads(json.dumps(OPENAPI))


@pytest.mark.parametrize("operation", OPERATIONS, ids=lambda op: op.label)
def test_every_operation_answers_within_its_schema(
    operation: Any, live_service: dict[str, str]
) -> None:
    headers = {"Authorization": f"Bearer {live_service['token']}"}
    cases = operation.as_strategy(GenerationMode.POSITIVE) | operation.as_strategy(
        GenerationMode.NEGATIVE
    )

    @given(case=cases, model=st.sampled_from([*MODELS, None]), data=st.data())
    @settings(
        max_examples=EXAMPLES_PER_OPERATION,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def exchange(case: Any, model: str | None, data: st.DataObject) -> None:
        if model is not None:
            _use_model(case.body, model)
        collection = operation.path.split("/")[2] if operation.path.startswith("/v1/") else ""
        for name, value in (case.path_parameters or {}).items():
            # Half the time an id or name that exists, so that cancel, retry
            # and result meet real tasks and jobs, not only 404s.
            known = sorted(KNOWN.get(collection, ()))
            if isinstance(value, str) and known and data.draw(st.booleans()):
                case.path_parameters[name] = data.draw(st.sampled_from(known))
        codes = sorted(KNOWN["codes"])
        if collection == "session" and codes and data.draw(st.booleans()):
            case.query = {**(case.query or {}), "code": data.draw(st.sampled_from(codes))}
        response = case.call(
            base_url=live_service["url"], headers=headers, timeout=30, allow_redirects=False
        )
        _remember(operation.path, response)
        TALLY["requests"] += 1
        TALLY[f"status {response.status_code}"] += 1
        PER_OPERATION[f"{operation.label} -> {response.status_code}"] += 1
        if response.status_code >= 500:
            TALLY["5xx"] += 1
        try:
            case.validate_response(response, checks=CHECKS)
        except Exception:
            TALLY["schema violations"] += 1
            raise

    exchange()
