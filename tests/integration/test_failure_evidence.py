"""What went wrong, kept and served: a failed API attempt's answer, a frozen page's state."""

from __future__ import annotations

import asyncio
import logging
import re
from pathlib import Path

import httpx
import pytest

from tests.support.harness import running_service
from tests.support.helpers import traced_demo_profile
from webrunner.evidence import ABANDON_S, SCREENSHOT_S, TRACE_STOP_S

# 90 s stale -> 4.5 s; 15 s heartbeat -> 0.75 s (as in test_web_lanes).
WEB_SCALE = 0.05


async def test_a_failed_api_attempt_keeps_the_vendors_answer(tmp_path: Path) -> None:
    async with running_service(tmp_path) as h:
        task = await h.submit("demo-chat-api", "refused [status=400]")
        done = await h.wait_task(task["id"])
        assert done["state"] == "failed"
        (kept,) = done["artifacts"]["1"]
        assert kept["name"] == "answer.txt" and kept["kind"] == "answer" and kept["size"] > 0
        url = f"/v1/tasks/{task['id']}/artifacts/1/answer.txt"
        served = await h.http.get(url)
        assert served.status_code == 200
        assert served.headers["content-type"].startswith("text/plain")
        assert "sandbox" in served.headers["content-security-policy"]
        assert "forced status 400" in served.text  # the provider's own words
        for bad, status in (
            ("/artifacts/1/..%2F..%2F..%2Ftoken", 404),  # no such route
            ("/artifacts/1/.env", 400),
            ("/artifacts/1/page.html", 404),
            ("/artifacts/x/answer.txt", 400),
            ("/artifacts/2/answer.txt", 404),
        ):
            answer = await h.http.get(f"/v1/tasks/{task['id']}{bad}")
            assert answer.status_code == status, (bad, answer.text)
            assert answer.json()["error"]["message"]
        async with httpx.AsyncClient(base_url=h.service.url) as anonymous:
            assert (await anonymous.get(url)).status_code == 401
        # A task that succeeded on its first attempt has none.
        fine = await h.submit("demo-chat-api", "all good")
        assert (await h.wait_task(fine["id"]))["artifacts"] == {}


@pytest.mark.browser
@pytest.mark.timeout(120)
async def test_a_frozen_page_is_reclaimed_without_waiting_on_it_and_its_trace_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    traced_demo_profile(tmp_path, "demo-traced", ("demo-1",))
    caplog.set_level(logging.INFO, logger="dispatcher")
    async with running_service(tmp_path, profiles=(), time_scale=WEB_SCALE) as h:
        task = await h.submit("demo-traced", "this page freezes [mode=hang]")
        deadline = asyncio.get_running_loop().time() + 60
        while (await h.task(task["id"]))["attempt"] < 2:
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.1)
        # The lane is free again once the hung browser is dead: the retry runs.
        await h.wait_task(task["id"], {"running"})
        logged = "\n".join(r.getMessage() for r in caplog.records)
        assert "the page did not answer within 2 s" in logged
        killed = re.search(r"attempt 1: run interrupted; browser pid \d+ killed", logged)
        assert killed is not None
        # The capture gave up on the frozen page after its bounds, not later:
        # the page's (its screenshot's is the longer), the abandoned call's,
        # the trace's. Unbounded, a frozen page holds an evaluate for ever.
        # Measured 2.3-6.0 s (the trace's save is the part a loaded run stretches).
        stale_at = next(r.created for r in caplog.records if "is stale" in r.getMessage())
        killed_at = next(r.created for r in caplog.records if "run interrupted" in r.getMessage())
        bounds_s = SCREENSHOT_S + ABANDON_S + TRACE_STOP_S
        assert killed_at - stale_at < bounds_s + 2.0
        # What the page did until it froze is in the trace, which the driver holds.
        answer = await h.task(task["id"])
        assert [a["kind"] for a in answer["artifacts"]["1"]] == ["trace"]
        trace = await h.http.get(f"/v1/tasks/{task['id']}/artifacts/1/trace.zip")
        assert trace.status_code == 200 and trace.content[:2] == b"PK"
        assert trace.headers["content-disposition"].startswith("attachment")
        await h.http.post(f"/v1/tasks/{task['id']}/cancel")
        assert (await h.wait_task(task["id"]))["state"] == "canceled"


@pytest.mark.browser
@pytest.mark.timeout(120)
async def test_a_logged_out_account_leaves_the_page_that_says_so(tmp_path: Path) -> None:
    # Prewarm off: the task's own page load meets the expired session, and its
    # page (the login form, settled) is the evidence; a page loaded ahead of
    # the task, before the expiry, would meet it only after the submit, in the
    # middle of the site's navigation to its login page.
    async with running_service(
        tmp_path, profiles=("demo-chat",), time_scale=WEB_SCALE, browser_prewarm=False
    ) as h:
        await h.http.post("/v1/accounts/demo-2/disable", json={"reason": "single account run"})
        await h.demo_mode({"mode": "expired"}, h.demo_web)
        task = await h.submit("demo-chat", "are we logged in?")
        deadline = asyncio.get_running_loop().time() + 60
        while not (await h.http.get("/v1/accounts")).json()[0]["needs_attention"]:
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.05)
        # The task waits (no attempt spent) for the operator, who finds the page
        # linked from the task (the dashboard, `dispatcher show`) and served here.
        waiting = await h.task(task["id"])
        assert waiting["state"] == "pending" and waiting["attempt"] == 1
        assert [a["kind"] for a in waiting["artifacts"]["1"]] == ["screenshot", "html"]
        html = await h.http.get(f"/v1/tasks/{task['id']}/artifacts/1/page.html")
        assert html.headers["content-type"].startswith("text/plain")
        assert 'id="login-form"' in html.text  # what the operator must deal with
        shot = await h.http.get(f"/v1/tasks/{task['id']}/artifacts/1/screenshot.png")
        assert shot.headers["content-type"] == "image/png" and shot.content[:4] == b"\x89PNG"
