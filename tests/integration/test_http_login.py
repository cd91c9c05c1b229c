"""The login routes' edges without a browser: where a one-time link may lead, and refusals."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.support.harness import running_service


@pytest.mark.parametrize(
    ("next_path", "lands_on"),
    [
        ("/%23login/demo-1", "/#login/demo-1"),
        ("//evil.example/", "/"),
        ("https://evil.example/", "/"),
        ("/%23login/<script>", "/"),
        ("/v1/tasks", "/"),
    ],
)
async def test_a_one_time_link_leads_only_to_a_dashboard_page(
    tmp_path: Path, next_path: str, lands_on: str
) -> None:
    async with running_service(tmp_path) as h, httpx.AsyncClient(base_url=h.service.url) as anon:
        code = (await h.http.post("/v1/dashboard-code")).json()["code"]
        answer = await anon.get(f"/v1/session?code={code}&next={next_path}")
        assert answer.status_code == 303
        assert answer.headers["location"] == lands_on
        # Single use, whatever the target.
        again = await anon.get(f"/v1/session?code={code}&next={next_path}")
        assert again.status_code == 403


async def test_login_and_import_are_refused_clearly_without_a_web_account(tmp_path: Path) -> None:
    async with running_service(tmp_path) as h:
        login = await h.http.post("/v1/accounts/demo/login")
        assert login.status_code == 404 and "no web models" in login.text
        imported = await h.http.post("/v1/accounts/demo/import", json={"text": "x"})
        assert imported.status_code == 404
        empty = await h.http.post("/v1/accounts/demo/import", json={})
        assert empty.status_code == 400 and "text" in empty.text
