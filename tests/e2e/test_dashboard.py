"""The dashboard in a real headless Chromium against the real service.

The page signs in with a one-time code (never the token), shows lanes, jobs
and tasks, moves live as tasks finish (no reload), and its buttons act:
disable/enable an account, cancel a task or a job, retry a failed task.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import httpx
import pytest
from playwright.async_api import Dialog, expect

from tests.e2e.dashboard_browser import Browser, job_row, sign_in, task_row
from tests.support.harness import running_service

# One browser for the module (starting Chromium is the slow part); a fresh
# context, so fresh cookies and storage, for every test (tests/e2e/conftest.py).
pytestmark = [
    pytest.mark.browser,
    pytest.mark.timeout(120),
    pytest.mark.asyncio(loop_scope="module"),
]

expect.set_options(timeout=15_000)


async def test_without_a_session_the_page_shows_no_data(tmp_path: Path, browser: Browser) -> None:
    async with running_service(tmp_path) as h:
        page = browser.page
        task = await h.submit("demo-chat-api", "a private prompt")
        await h.wait_task(task["id"])
        response = await page.goto(f"{h.service.url}/")
        assert response is not None and response.status == 200
        await expect(page.get_by_test_id("signed-out")).to_be_visible()
        await expect(page.get_by_test_id("signed-out")).to_contain_text(
            "python -m dispatcher dashboard"
        )
        await expect(page.get_by_test_id("app")).to_be_hidden()
        for testid in ("lane-row", "account-row", "job-row", "task-row"):
            assert await page.get_by_test_id(testid).count() == 0
        assert "a private prompt" not in await page.content()
        assert task["id"] not in await page.content()
        # The page's own requests are refused without a session...
        assert await page.evaluate("fetch('/v1/lanes').then(r => r.status)") == 401
        # ...and a made-up code buys none.
        response = await page.goto(f"{h.service.url}/v1/session?code=made-up")
        assert response is not None and response.status == 403
        assert await browser.page.context.cookies() == []
        assert browser.problems == []


async def test_running_job_moves_live_and_the_token_stays_out_of_reach(
    tmp_path: Path, browser: Browser
) -> None:
    async with running_service(tmp_path, concurrency={"demo": 1}, budgets={"demo": 1}) as h:
        page = browser.page
        await sign_in(h, page)
        await page.evaluate("window.__no_reload = 42")

        # Created after the page loaded: it must arrive through the event stream.
        job = await h.job(
            "story shots",
            [
                {"model": "demo-chat-api", "params": {"prompt": f"shot {i}", "gen_s": 25}}
                for i in range(5)
            ],
        )
        row = job_row(page, job["id"])
        await expect(row).to_be_visible()
        await expect(row).to_contain_text("story shots")
        bar = row.get_by_test_id("job-progress")
        seen: set[int] = set()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        while loop.time() < deadline:
            seen.add(int(await bar.get_attribute("data-done") or 0))
            if 5 in seen:
                break
            await asyncio.sleep(0.05)
        assert 5 in seen, seen
        assert len(seen & {1, 2, 3, 4}) >= 2, f"progress did not move step by step: {seen}"
        await expect(row).to_have_attribute("data-state", "success")
        await expect(row.get_by_test_id("job-progress-label")).to_have_text("5/5")
        await expect(row.get_by_test_id("job-success")).to_have_text("5")
        assert await page.evaluate("window.__no_reload") == 42

        # The lanes and the accounts are on the page too; cost and budget with them.
        lane = page.locator('[data-testid=lane-row][data-lane="api:demo"]')
        await expect(lane).to_contain_text("demo-chat-api")
        await expect(lane.get_by_test_id("lane-budget")).to_have_text("$0.05 of $1.00 today")
        await expect(row.get_by_test_id("job-cost")).to_have_text("$0.05")
        account = page.locator('[data-testid=account-row][data-account="demo"]')
        await expect(account).to_have_attribute("data-enabled", "yes")

        # The job's page: its tasks, with state and attempt.
        await row.get_by_test_id("job-select").click()
        await expect(page.get_by_test_id("job-title")).to_contain_text("story shots")
        await expect(page.get_by_test_id("job-fact-cost")).to_have_text("$0.05")
        await expect(page.locator("[data-testid=task-row][data-state=success]")).to_have_count(5)
        assert await page.evaluate("window.__no_reload") == 42  # a page of the same app
        # Its times carry their day (a bare clock time read days later misleads).
        created = page.locator("#job-head dd").first
        await expect(created).to_have_text(re.compile(r"^today \d\d:\d\d:\d\d$"))

        # The token is nowhere a script (or the markup) could read it.
        token = h.service.credentials.token
        assert token not in await page.content()
        for asset in ("/static/dashboard.js", "/static/dashboard.css", "/"):
            text = await page.evaluate(f"fetch('{asset}').then(r => r.text())")
            assert token not in text
        assert await page.evaluate("document.cookie") == ""
        storage = await page.evaluate(
            "JSON.stringify([Object.entries(localStorage), Object.entries(sessionStorage)])"
        )
        assert token not in storage and json.loads(storage) == [[], []]
        (cookie,) = await page.context.cookies()
        assert cookie["name"] == "dispatcher_session" and cookie["value"] != token
        assert cookie["httpOnly"] is True and cookie["sameSite"] == "Strict"
        assert browser.problems == []


async def test_buttons_disable_enable_cancel_and_retry(tmp_path: Path, browser: Browser) -> None:
    async with running_service(tmp_path, concurrency={"demo": 1}) as h:
        page = browser.page
        await sign_in(h, page)

        # Disabling an account from the page: asked for a reason, takes effect.
        dialogs: list[str] = []

        async def answer(dialog: Dialog) -> None:
            dialogs.append(dialog.message)
            await dialog.accept("vendor is flaky today")

        page.on("dialog", answer)
        account = page.locator('[data-testid=account-row][data-account="demo-queue"]')
        await account.get_by_test_id("account-disable").click()
        await expect(account).to_have_attribute("data-enabled", "no")
        await expect(account.get_by_test_id("account-reason")).to_have_text("vendor is flaky today")
        assert dialogs and "demo-queue" in dialogs[0]
        accounts = {a["name"]: a for a in (await h.http.get("/v1/accounts")).json()}
        assert accounts["demo-queue"]["enabled"] is False
        assert accounts["demo-queue"]["reason"] == "vendor is flaky today"
        held = await h.submit("demo-queue", "poster while disabled", gen_s=1)
        lane = page.locator('[data-testid=lane-row][data-lane="api:demo-queue"]')
        await expect(lane.get_by_test_id("lane-enabled")).to_have_attribute("data-enabled", "no")
        await expect(lane.get_by_test_id("lane-queued")).to_have_text("1")
        await asyncio.sleep(0.3)
        assert (await h.task(held["id"]))["state"] == "pending"
        await account.get_by_test_id("account-enable").click()
        await expect(account).to_have_attribute("data-enabled", "yes")
        assert (await h.wait_task(held["id"]))["state"] == "success"

        # Cancel a running task from its row in the active tasks.
        long = await h.submit("demo-video", "a very long clip", gen_s=3000)
        await h.wait_task(long["id"], {"running"})
        row = task_row(page, long["id"])
        await expect(row).to_have_attribute("data-state", "running")
        await row.get_by_test_id("task-cancel").click()
        assert (await h.wait_task(long["id"]))["state"] == "canceled"
        await expect(row).to_have_count(0)  # gone from the active tasks

        # Cancel a whole job from its row.
        job = await h.job(
            "to cancel",
            [
                {"model": "demo-video", "params": {"prompt": f"slow {i}", "gen_s": 3000}}
                for i in range(3)
            ],
        )
        await h.wait_task(job["tasks"][0]["id"], {"running"})
        jrow = job_row(page, job["id"])
        await jrow.get_by_test_id("job-cancel").click()
        await expect(jrow).to_have_attribute("data-state", "canceled")
        done = await h.wait_job(job["id"])
        assert done["counts"]["canceled"] == 3

        # Retry a failed task from the job's task list.
        job = await h.job(
            "with a refusal",
            [
                {"model": "demo-chat-api", "params": {"prompt": "refused [status=400]"}},
            ],
        )
        failed = (await h.wait_job(job["id"]))["tasks"][0]
        assert failed["state"] == "failed"
        jrow = job_row(page, job["id"])
        await expect(jrow).to_have_attribute("data-state", "failed")
        await jrow.get_by_test_id("job-select").click()
        frow = task_row(page, failed["id"])
        await expect(frow.get_by_test_id("task-error")).to_contain_text("400")
        await frow.get_by_test_id("task-retry").click()
        await expect(frow.get_by_test_id("task-attempt")).to_have_text("2/3")
        assert (await h.task(failed["id"]))["attempt"] == 2
        # Its page counts the time of both attempts, and says so.
        await h.wait_task(failed["id"], {"running", "failed"})
        again = await h.wait_task(failed["id"], {"failed"})
        await frow.click()
        took = page.locator("#task-page [data-testid=task-elapsed]")
        await expect(took).to_contain_text("over 2 attempts")
        assert again["started_at"] > failed["started_at"]  # the last attempt alone is shorter
        assert browser.problems == []


async def test_writes_with_the_session_need_the_dashboard_header(tmp_path: Path) -> None:
    async with running_service(tmp_path) as h:
        code = (await h.http.post("/v1/dashboard-code")).json()["code"]
        async with httpx.AsyncClient(base_url=h.service.url) as anon:
            session = await anon.get(f"/v1/session?code={code}")
            assert session.status_code == 303 and session.headers["location"] == "/"
            cookie = session.cookies["dispatcher_session"]
            set_cookie = session.headers["set-cookie"].lower()
            assert "httponly" in set_cookie and "samesite=strict" in set_cookie
            assert (await anon.get(f"/v1/session?code={code}")).status_code == 403  # once only
            jar = {"Cookie": f"dispatcher_session={cookie}"}
            assert (await anon.get("/v1/lanes", headers=jar)).status_code == 200
            bare = await anon.post("/v1/accounts/demo/disable", json={"reason": "x"}, headers=jar)
            assert bare.status_code == 403 and "X-Requested-With" in bare.json()["error"]["message"]
            marked = await anon.post(
                "/v1/accounts/demo/disable",
                json={"reason": "x"},
                headers={**jar, "X-Requested-With": "dispatcher-dashboard"},
            )
            assert marked.status_code == 200 and marked.json()["enabled"] is False
            # A session cannot mint more sessions: that needs the token.
            minted = await anon.post(
                "/v1/dashboard-code",
                json={},
                headers={**jar, "X-Requested-With": "dispatcher-dashboard"},
            )
            assert minted.status_code == 403
            stale = await anon.get("/v1/lanes", headers={"Cookie": "dispatcher_session=old"})
            assert stale.status_code == 403 and "dashboard" in stale.json()["error"]["message"]
            page = await anon.get("/")
            assert "script-src 'self'" in page.headers["content-security-policy"]
