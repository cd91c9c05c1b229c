"""A real gradio app behind gradio's own login page (issue 27), through the
whole service, from `profiles/examples/gradio-login.toml` as shipped.

`tests/gradio_apps/login_app.py` serves a streaming ChatInterface with
`auth=` in one process for the module. The account logs in as an operator
logs one in: gradio's `/login` with curl, then `dispatcher accounts import`.
A logout is never charged an attempt: not when the page shows gradio's login
form, and not when the session is revoked while the page is already loaded
(the page then shows only gradio's "Error" badge).
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from dispatcher.settings import Settings, find_browser
from tests.gradio_apps.common import LOGIN_PASSWORD, LOGIN_USER
from tests.gradio_apps.process import GradioProcess
from tests.support.harness import Harness, serving
from tests.support.helpers import REPO
from tests.support.servicecli import clean_env, run_cli

pytestmark = [pytest.mark.browser, pytest.mark.timeout(240)]

MODEL = "gradio-login"
ACCOUNT = "gradio-login-1"
# Real seconds gradio gets to import and serve (~3 s quiet, far more when busy).
START_S = 180.0


@pytest.fixture(scope="module")
def app_url() -> Iterator[str]:
    app = GradioProcess("login_app")
    try:
        app.until_serving_blocking("/", START_S)
        yield f"{app.url}/"
    finally:
        app.stop()


@asynccontextmanager
async def service(
    tmp_path: Path, app_url: str, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Harness]:
    if find_browser() is None:
        pytest.skip("no Chromium on this machine")
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    shutil.copy(REPO / "profiles" / "examples" / f"{MODEL}.toml", profiles)
    monkeypatch.setenv("GRADIO_LOGIN_URL", app_url)
    settings = Settings(
        state_dir=tmp_path / "state",
        profiles_dir=profiles,
        # Real time: the profile's stable_ms and timeouts are the ones shipped.
        time_scale=1.0,
        # The first task, not the lane's opening, meets the login form.
        browser_prewarm=False,
    )
    async with serving(settings) as h:
        yield h


def log_in(app_url: str, cookies_txt: Path) -> None:
    """What an operator does: gradio's login with curl, which writes cookies.txt."""
    done = subprocess.run(
        [
            *("curl", "-s", "-c", str(cookies_txt)),
            *("-d", f"username={LOGIN_USER}", "-d", f"password={LOGIN_PASSWORD}"),
            f"{app_url}login",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert '"success":true' in done.stdout.replace(" ", ""), done.stdout


async def import_login(h: Harness, site: httpx.AsyncClient, app_url: str) -> None:
    """gradio's login, its cookies imported over the service's API (as the CLI does)."""
    login = await site.post(
        f"{app_url}login", data={"username": LOGIN_USER, "password": LOGIN_PASSWORD}
    )
    assert login.status_code == 200, login.text
    host = httpx.URL(app_url).host
    text = "".join(
        f"#HttpOnly_{host}\tFALSE\t/\tFALSE\t0\t{name}\t{value}\n"
        for name, value in login.cookies.items()
    )
    answer = await h.http.post(f"/v1/accounts/{ACCOUNT}/import", json={"text": text})
    assert answer.status_code == 200 and answer.json()["logged_in"] is True, answer.text


async def held_for_login(h: Harness, task_id: str) -> dict[str, Any]:
    """The task once the logout it met sent it back: the account needs
    attention, the task waits pending on the same attempt."""
    account = await h.wait_account(ACCOUNT, "needs_attention", timeout_s=90)
    assert "logged out" in account["reason"], account
    held = await h.wait_task(task_id, {"pending"}, timeout_s=30)
    assert held["attempt"] == 1, held
    return held


async def test_tasks_run_once_the_account_is_logged_in_through_gradios_login(
    tmp_path: Path, app_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if shutil.which("curl") is None:
        pytest.skip("no curl on this machine")
    async with service(tmp_path, app_url, monkeypatch) as h:
        first = await h.submit(MODEL, "first light over the bay")
        # gradio's login form is the logged-out marker: no attempt spent.
        await held_for_login(h, first["id"])
        cookies = tmp_path / "cookies.txt"
        log_in(app_url, cookies)
        env = clean_env({"DISPATCHER_STATE_DIR": str(h.state_dir)})
        imported = await asyncio.to_thread(
            run_cli, ["accounts", "import", ACCOUNT, str(cookies)], env, tmp_path
        )
        assert imported.returncode == 0, imported.stdout + imported.stderr
        assert "logged in" in imported.stdout
        done = await h.wait_task(first["id"], timeout_s=90)
        assert (done["state"], done["attempt"]) == ("success", 1), done
        assert done["result"]["text"] == "echo: first light over the bay"
        second = await h.submit(MODEL, "3 & <three>")
        done = await h.wait_task(second["id"], timeout_s=90)
        assert (done["state"], done["result"]["text"]) == ("success", "echo: 3 & <three>")


async def test_a_session_revoked_on_a_loaded_page_is_a_logout_not_a_failed_attempt(
    tmp_path: Path, app_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with service(tmp_path, app_url, monkeypatch) as h, httpx.AsyncClient() as site:
        await import_login(h, site, app_url)
        first = await h.submit(MODEL, "before the sign-out")
        done = await h.wait_task(first["id"], timeout_s=90)
        assert done["result"]["text"] == "echo: before the sign-out", done
        # The account's page stays loaded for its next task. The session ends
        # under it, as when the user signs out elsewhere: gradio forgets it.
        revoked = await site.get(f"{app_url}logout", follow_redirects=False)
        assert revoked.status_code == 302
        assert (await site.get(f"{app_url}config")).status_code == 401
        second = await h.submit(MODEL, "after the sign-out")
        held = await held_for_login(h, second["id"])
        assert "auth" in held["attempts"][-1]["error"]["message"], held["attempts"]
        # Logged in again, the task runs on the same attempt.
        await import_login(h, site, app_url)
        done = await h.wait_task(second["id"], timeout_s=90)
        assert (done["state"], done["attempt"]) == ("success", 1), done
        assert done["result"]["text"] == "echo: after the sign-out"
