"""Logging a web account in from afar: the dashboard's live view of its own browser.

A Playwright-driven "operator" browser opens the one-time login link,
clicks into the streamed image and types, as a person would; the service's
own Chromium (on the account's profile) gets the input over CDP.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from urllib.parse import quote

import httpx
import psutil
import pytest
from playwright.async_api import Page, expect

from dispatcher.models import Kind
from tests.e2e.dashboard_browser import Browser, keep_screenshot, sign_in
from tests.support.harness import Harness, running_service
from tests.support.helpers import REPO, demo_chat_on
from tests.support.servicecli import clean_env, run_cli
from webrunner.browser import start_browser
from webrunner.runner import WebRunner

pytestmark = [
    pytest.mark.browser,
    # A last resort only: each wait inside has its own deadline (30 s), and a
    # test makes several, each seconds long under load.
    pytest.mark.timeout(180),
    pytest.mark.asyncio(loop_scope="module"),
]

SCALE = 0.05
ACCOUNT = "demo-1"
# A wait on the service's own browser (a frame streamed, a graceful close
# before "logged in" or "canceled"): Playwright's default 5 s is outrun by
# a busy machine, so these get the 30 s of the file's other waits.
SERVICE_MS = 30_000
# A live view's frame counter once it shows something: a page repainting, or
# a busy machine, can send several before Playwright's first read (CI once
# read "2" where "1" was waited for).
AT_LEAST_ONE = re.compile(r"^[1-9][0-9]*$")


def one_account(tmp_path: Path, time_scale: float = SCALE) -> AbstractAsyncContextManager[Harness]:
    """The service with the demo chat on one account: one browser less to start and log in."""
    demo_chat_on(tmp_path, (ACCOUNT,))
    return running_service(tmp_path, profiles=(), time_scale=time_scale)


def runner_of(h: Harness) -> WebRunner:
    runner = h.service.runners[Kind.WEB]
    assert isinstance(runner, WebRunner)
    return runner


async def log_everyone_out(h: Harness) -> None:
    """The demo site forgets every session (once the account's browser, started
    as its lane opened, is up: the logout comes while the service runs)."""
    await h.browsers_started()
    await h.demo_mode({"mode": "expired"}, base=h.demo_web)
    await h.demo_mode({"mode": "normal"}, base=h.demo_web)


async def logged_out_task(h: Harness) -> str:
    """A task that meets the logout: the account needs attention, and the task
    waits for it, pending on the same attempt (a logout is not the task's fault)."""
    task = await h.submit("demo-chat", "hello after the login")
    deadline = asyncio.get_running_loop().time() + 30.0
    while True:
        accounts = (await h.http.get("/v1/accounts")).json()
        account = next(a for a in accounts if a["name"] == ACCOUNT)
        if account["needs_attention"]:
            break
        assert asyncio.get_running_loop().time() < deadline, account
        await asyncio.sleep(0.02)
    # The account's state is written first, then the task's.
    held = await h.wait_task(task["id"], {"pending"})
    assert held["attempt"] == 1, held
    assert "auth" in held["attempts"][-1]["error"]["message"], held["attempts"]
    return str(task["id"])


async def open_login_link(h: Harness, page: Page) -> None:
    """What `dispatcher accounts login` does, then the operator opens the link it prints."""
    opened = await h.http.post(f"/v1/accounts/{ACCOUNT}/login")
    assert opened.status_code == 201, opened.text
    assert psutil.pid_exists(opened.json()["browser_pid"])
    code = (await h.http.post("/v1/dashboard-code")).json()["code"]
    next_path = quote(opened.json()["path"], safe="/")
    await page.goto(f"{h.service.url}/v1/session?code={code}&next={next_path}")
    assert page.url == f"{h.service.url}/#login/{ACCOUNT}"
    await expect(page.get_by_test_id("login-screen")).to_have_attribute(
        "data-frames", AT_LEAST_ONE, timeout=SERVICE_MS
    )


async def click_on_screen(h: Harness, page: Page, selector: str) -> None:
    """Click where the streamed image shows `selector` (found in the service's own page)."""
    view = runner_of(h).logins.get(ACCOUNT).view
    assert view is not None and view.frame is not None
    box = await view.page.locator(selector).bounding_box()
    assert box is not None
    screen = page.get_by_test_id("login-screen")
    shown = await screen.bounding_box()
    assert shown is not None
    x = (box["x"] + box["width"] / 2) / view.frame.width_px * shown["width"]
    y = (box["y"] + box["height"] / 2) / view.frame.height_px * shown["height"]
    await screen.click(position={"x": x, "y": y})


async def generating(h: Harness, task_id: str) -> None:
    """Wait until the task's prompt is in the page (its browser is up)."""
    deadline = asyncio.get_running_loop().time() + 30
    while (await h.task(task_id))["stage"] != "generating":
        assert asyncio.get_running_loop().time() < deadline, "the task never started generating"
        await asyncio.sleep(0.02)


async def test_operator_logs_in_through_the_live_view_and_the_task_runs(
    tmp_path: Path, browser: Browser
) -> None:
    async with one_account(tmp_path) as h:
        await log_everyone_out(h)
        task_id = await logged_out_task(h)
        page = browser.page
        await open_login_link(h, page)
        second = await h.http.post(f"/v1/accounts/{ACCOUNT}/login")
        assert second.status_code == 409 and "already open" in second.text

        await click_on_screen(h, page, "#login-form input[name=username]")
        await page.keyboard.type(ACCOUNT)
        service_page = runner_of(h).logins.get(ACCOUNT).view
        assert service_page is not None
        form = service_page.page.locator("#login-form")
        await expect(form.locator("input[name=username]")).to_have_value(ACCOUNT)
        await click_on_screen(h, page, "#login-form input[name=password]")
        await page.keyboard.type("secret")
        await expect(form.locator("input[name=password]")).to_have_value("secret")
        await page.keyboard.press("Enter")
        await expect(service_page.page.locator("#composer")).to_be_visible(timeout=SERVICE_MS)
        assert ACCOUNT in await service_page.page.locator("header").inner_text()
        await keep_screenshot(page, "remote-login")

        pid = runner_of(h).logins.get(ACCOUNT).pid
        await page.get_by_test_id("login-done").click()
        await expect(page.get_by_test_id("login-status")).to_contain_text(
            "logged in", timeout=SERVICE_MS
        )
        assert pid is not None and not psutil.pid_exists(pid)
        accounts = (await h.http.get("/v1/accounts")).json()
        assert next(a for a in accounts if a["name"] == ACCOUNT)["enabled"]
        # The task that met the logout waited, and now succeeds on the same attempt.
        done = await h.wait_task(task_id, {"success"}, timeout_s=30)
        assert done["owner"] == ACCOUNT and "hello after the login" in done["result"]["text"]
        assert done["attempt"] == 1
        assert browser.problems == []


async def test_cancel_closes_the_browser_and_changes_nothing(
    tmp_path: Path, browser: Browser
) -> None:
    async with one_account(tmp_path) as h:
        await log_everyone_out(h)
        await logged_out_task(h)
        page = browser.page
        # As an operator would: the CLI prints the link, the browser opens it.
        printed = await asyncio.to_thread(
            run_cli,
            ["--state-dir", str(h.state_dir), "accounts", "login", ACCOUNT],
            clean_env({}),
            REPO,
        )
        assert printed.returncode == 0, printed.stderr
        assert "ssh -N -L" in printed.stderr
        await page.goto(printed.stdout.strip())
        assert page.url == f"{h.service.url}/#login/{ACCOUNT}"
        await expect(page.get_by_test_id("login-screen")).to_have_attribute(
            "data-frames", AT_LEAST_ONE, timeout=SERVICE_MS
        )
        pid = runner_of(h).logins.get(ACCOUNT).pid
        # Done on a page that still shows the form: refused, the view stays open.
        await page.get_by_test_id("login-done").click()
        await expect(page.get_by_test_id("login-status")).to_contain_text(
            "not show", timeout=SERVICE_MS
        )
        await page.get_by_test_id("login-cancel").click()
        await expect(page.get_by_test_id("login-status")).to_contain_text(
            "canceled", timeout=SERVICE_MS
        )
        assert pid is not None and not psutil.pid_exists(pid)
        accounts = (await h.http.get("/v1/accounts")).json()
        assert next(a for a in accounts if a["name"] == ACCOUNT)["needs_attention"]
        again = await h.http.post(f"/v1/accounts/{ACCOUNT}/login/done")
        assert again.status_code == 409 and "no login session" in again.text


async def test_a_running_task_can_be_watched_without_input(
    tmp_path: Path, browser: Browser
) -> None:
    async with one_account(tmp_path) as h:
        task = await h.submit("demo-chat", "watched [duration=80]")
        await generating(h, task["id"])
        page = browser.page
        await sign_in(h, page)
        await page.goto(f"{h.service.url}/#task/{task['id']}")
        await page.get_by_test_id("task-watch").click()
        screen = page.get_by_test_id("task-live-screen")
        await expect(screen).to_have_attribute("data-frames", AT_LEAST_ONE)
        # Read-only: the view has no controls, and the task goes on to its answer.
        await expect(page.get_by_test_id("login-done")).to_have_count(0)
        done = await h.wait_task(task["id"], {"success"}, timeout_s=30)
        assert "watched" in done["result"]["text"]
        await expect(page.get_by_test_id("task-live")).to_have_count(0)
        assert browser.problems == []


async def _demo_cookie(h: Harness) -> str:
    async with httpx.AsyncClient() as client:
        answer = await client.post(
            f"{h.demo_web}/login", data={"username": ACCOUNT, "password": "pw"}
        )
    assert answer.status_code == 303
    return answer.cookies["demo_session"]


async def test_imported_cookie_files_make_the_account_usable(tmp_path: Path) -> None:
    async with one_account(tmp_path) as h:
        await log_everyone_out(h)
        task_id = await logged_out_task(h)
        host = httpx.URL(h.demo_web).host
        cookie = await _demo_cookie(h)
        bad = await h.http.post(
            f"/v1/accounts/{ACCOUNT}/import", json={"text": f"{host}\tFALSE\t/\tFALSE\n"}
        )
        assert bad.status_code == 400 and "line 1" in bad.text
        stale = f"{host}\tFALSE\t/\tFALSE\t0\tdemo_session\tnot-a-session\n"
        answer = await h.http.post(f"/v1/accounts/{ACCOUNT}/import", json={"text": stale})
        assert answer.json()["logged_in"] is False
        netscape = (
            "# Netscape HTTP Cookie File\n"
            f"#HttpOnly_{host}\tFALSE\t/\tFALSE\t0\tdemo_session\t{cookie}\n"
        )
        answer = await h.http.post(f"/v1/accounts/{ACCOUNT}/import", json={"text": netscape})
        assert answer.json()["logged_in"] is True, answer.text
        assert answer.json()["requeued"] == []  # it waited, pending: nothing to retry
        done = await h.wait_task(task_id, {"success"}, timeout_s=30)
        assert done["owner"] == ACCOUNT and done["attempt"] == 1


async def test_cli_imports_a_storage_state_and_reports_bad_files(tmp_path: Path) -> None:
    async with one_account(tmp_path) as h:
        await log_everyone_out(h)
        host = httpx.URL(h.demo_web).host
        state = {
            "cookies": [
                {
                    "name": "demo_session",
                    "value": await _demo_cookie(h),
                    "domain": host,
                    "path": "/",
                    "expires": -1,
                    "httpOnly": True,
                    "secure": False,
                    "sameSite": "Lax",
                }
            ],
            "origins": [],
        }
        good = tmp_path / "state.json"
        good.write_text(json.dumps(state))
        broken = tmp_path / "broken.json"
        state["cookies"][0]["sameSite"] = "sometimes"
        broken.write_text(json.dumps(state))
        env = clean_env({})

        def cli(*args: str) -> subprocess.CompletedProcess[str]:
            return run_cli(["--state-dir", str(h.state_dir), "accounts", *args], env, REPO)

        refused = await asyncio.to_thread(cli, "import", ACCOUNT, str(broken))
        assert refused.returncode == 2 and "cookies[0].sameSite" in refused.stderr
        imported = await asyncio.to_thread(cli, "import", ACCOUNT, str(good))
        assert imported.returncode == 0, imported.stderr
        assert f"{ACCOUNT}: logged in" in imported.stdout
        accounts = (await h.http.get("/v1/accounts")).json()
        assert next(a for a in accounts if a["name"] == ACCOUNT)["enabled"]


async def _profile_cookie_domains(h: Harness) -> set[str]:
    """The domains of the cookies stored in the account's profile, read by a
    browser of its own on the profile (the kept one closed meanwhile)."""
    runner = runner_of(h)
    async with runner.logins.hold_profile(ACCOUNT) as user_data_dir:
        session = await start_browser(
            runner.playwright, executable=runner.browser_executable, user_data_dir=user_data_dir
        )
        try:
            return {c["domain"] for c in await session.context.cookies()}
        finally:
            await session.close()


async def test_cli_import_keeps_only_the_sites_cookies_and_refuses_huge_files(
    tmp_path: Path,
) -> None:
    async with one_account(tmp_path) as h:
        await log_everyone_out(h)
        host = httpx.URL(h.demo_web).host
        foreign = "".join(
            f"{domain}\tTRUE\t/\tTRUE\t0\t{name}\tstolen\n"
            for domain, name in ((".bank.example", "bank_sid"), ("mail.example", "mail_sid"))
        )
        every_site = tmp_path / "every-site.txt"
        every_site.write_text(
            f"# Netscape HTTP Cookie File\n{foreign}"
            f"#HttpOnly_{host}\tFALSE\t/\tFALSE\t0\tdemo_session\t{await _demo_cookie(h)}\n"
        )
        only_foreign = tmp_path / "foreign.txt"
        only_foreign.write_text(foreign)
        huge = tmp_path / "huge.txt"
        line = f"{host}\tFALSE\t/\tFALSE\t0\tpad\t{'x' * 1000}\n"
        huge.write_text(line * 1100)  # 1.1 MB: over the 1 MiB request cap
        env = clean_env({})

        def cli(*args: str) -> subprocess.CompletedProcess[str]:
            return run_cli(["--state-dir", str(h.state_dir), "accounts", *args], env, REPO)

        imported = await asyncio.to_thread(cli, "import", ACCOUNT, str(every_site))
        assert imported.returncode == 0, imported.stderr
        assert "1 cookie(s) imported, 2 for other sites dropped" in imported.stdout
        assert await _profile_cookie_domains(h) == {host}
        refused = await asyncio.to_thread(cli, "import", ACCOUNT, str(only_foreign))
        assert refused.returncode == 2
        assert f"none of the file's 2 cookie(s) is for {host}" in refused.stderr
        too_large = await asyncio.to_thread(cli, "import", ACCOUNT, str(huge))
        assert too_large.returncode == 2, too_large.stderr
        assert "the most a session file may hold" in too_large.stderr


async def test_a_task_waits_alive_while_a_login_holds_the_profile(tmp_path: Path) -> None:
    async with one_account(tmp_path) as h:
        opened = await h.http.post(f"/v1/accounts/{ACCOUNT}/login")
        assert opened.status_code == 201
        task = await h.submit("demo-chat", "after the operator")
        await h.wait_task(task["id"], {"running"})
        # Longer than the stale limit (90 s x 0.05): the waiting task keeps beating.
        stale_s = h.service.scheduler.stale_s
        deadline = asyncio.get_running_loop().time() + stale_s * 1.5
        while asyncio.get_running_loop().time() < deadline:
            waiting = await h.task(task["id"])
            assert waiting["state"] == "running" and waiting["attempt"] == 1, waiting
            await asyncio.sleep(0.1)
        closed = await h.http.post(f"/v1/accounts/{ACCOUNT}/login/cancel")
        assert closed.json() == {"account": ACCOUNT, "closed": True}
        done = await h.wait_task(task["id"], timeout_s=30)
        assert done["state"] == "success" and done["attempt"] == 1


async def test_an_idle_login_closes_by_itself_without_changes(tmp_path: Path) -> None:
    # 15 minutes x 0.004 = 3.6 s without input.
    async with one_account(tmp_path, time_scale=0.004) as h:
        await h.http.post("/v1/accounts/demo-1/disable", json={"reason": "being logged in"})
        opened = await h.http.post(f"/v1/accounts/{ACCOUNT}/login")
        pid = opened.json()["browser_pid"]
        login = runner_of(h).logins.get(ACCOUNT)
        assert login.runner_task is not None
        await asyncio.wait_for(asyncio.shield(login.runner_task), timeout=20)
        assert login.outcome == "idle" and not psutil.pid_exists(pid)
        late = await h.http.post(f"/v1/accounts/{ACCOUNT}/login/done")
        assert late.status_code == 409
        accounts = (await h.http.get("/v1/accounts")).json()
        account = next(a for a in accounts if a["name"] == ACCOUNT)
        assert not account["enabled"] and account["reason"] == "being logged in"
