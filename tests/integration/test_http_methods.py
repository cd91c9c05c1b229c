"""Wrong methods get 405 with Allow; the served document is the generated one."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.harness import running_service


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("PUT", "/v1/tasks", "GET, HEAD, POST"),
        ("DELETE", "/v1/tasks/abc", "GET, HEAD"),
        ("GET", "/v1/tasks/abc/cancel", "POST"),
        ("PATCH", "/v1/jobs", "GET, HEAD, POST"),
        ("POST", "/healthz", "GET, HEAD"),
    ],
)
async def test_a_wrong_method_gets_405_with_allow(
    tmp_path: Path, method: str, path: str, allow: str
) -> None:
    async with running_service(tmp_path) as h:
        response = await h.http.request(method, path)
        assert response.status_code == 405
        assert response.headers["allow"] == allow
        assert response.json()["error"]["kind"] == "http"


async def test_served_document_lists_errors_and_bounds(tmp_path: Path) -> None:
    async with running_service(tmp_path) as h:
        doc = (await h.http.get("/openapi.json")).json()
        post = doc["paths"]["/v1/tasks"]["post"]
        assert {"200", "201", "400", "401", "403", "413"} <= set(post["responses"])
        job = doc["components"]["schemas"]["JobBody"]
        assert job["properties"]["tasks"]["maxItems"] == 10_000
        too_many = await h.http.get("/v1/tasks?limit=501")
        assert too_many.status_code == 400
        odd = await h.http.get("/v1/tasks?limit=²")  # a digit to str.isdigit, not to int()
        assert odd.status_code == 400
