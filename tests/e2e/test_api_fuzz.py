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

from dispatcher.http.openapi import OPENAPI
from tests.procs import start_service, stop_proc, vendor_and_env

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
MODELS = ("demo-chat-api", "demo-video")


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
    summary.write_text(json.dumps(dict(TALLY)))
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
OPERATIONS = [
    result.ok()
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

    @given(case=cases, model=st.sampled_from([None, *MODELS]))
    @settings(
        max_examples=EXAMPLES_PER_OPERATION,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def exchange(case: Any, model: str | None) -> None:
        if model is not None:
            _use_model(case.body, model)
        response = case.call(base_url=live_service["url"], headers=headers, timeout=30)
        TALLY["requests"] += 1
        TALLY[f"status {response.status_code}"] += 1
        if response.status_code >= 500:
            TALLY["5xx"] += 1
        try:
            case.validate_response(response, checks=CHECKS)
        except Exception:
            TALLY["schema violations"] += 1
            raise

    exchange()
