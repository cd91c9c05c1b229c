"""Each web account's browser started when its lane opens, before its first
task: real service, real Chromium, the bundled demo web model."""

from __future__ import annotations

import asyncio
import gc
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.async_api import Page

from demo.web_model import demo_login, start_demo_web
from dispatcher.accounts.warmup import BrowserPrewarm
from dispatcher.errors import StoreError
from dispatcher.models import Kind
from dispatcher.settings import Settings, find_browser
from tests.integration.test_web_lanes import account_browsers, unknown_browsers
from tests.support.harness import Harness, running_service, serving
from tests.support.helpers import demo_chat_on
from webrunner.browser import BrowserSession
from webrunner.profiledirs import user_data_dir_for
from webrunner.runner import WebRunner

pytestmark = [pytest.mark.browser, pytest.mark.timeout(150)]

SCALE = 0.05  # 90 s stale -> 4.5 s: long enough for a browser start
# A task that starts its browser itself loads its first page in it too, in
# real time: on a busy CI that took longer than 4.5 s between two signs of
# life and the task was reclaimed as stale (a second launch). 18 s here.
FIRST_START_SCALE = 0.2


async def until(check: Callable[[], Awaitable[bool] | bool], what: str) -> None:
    """Wait for something the service does in the background (bounded; not a timing)."""
    deadline = time.monotonic() + 60
    while True:
        seen = check()
        if seen if isinstance(seen, bool) else await seen:
            return
        assert time.monotonic() < deadline, f"never: {what}"
        await asyncio.sleep(0.05)


def web_runner(h: Harness) -> WebRunner:
    runner = h.service.runners[Kind.WEB]
    assert isinstance(runner, WebRunner)
    return runner


def prewarm(h: Harness) -> BrowserPrewarm:
    assert h.service.prewarm is not None
    return h.service.prewarm


def counter(h: Harness, name: str) -> int:
    return web_runner(h).stats().counters[name]


async def metric(h: Harness, name: str) -> float:
    text = (await h.http.get("/metrics")).text
    found = re.search(rf"^{name} (\S+)$", text, re.M)
    assert found, text
    return float(found.group(1))


async def test_the_browser_starts_with_the_lane_and_the_first_task_reuses_it(
    tmp_path: Path,
) -> None:
    async with running_service(tmp_path, profiles=("demo-chat",), time_scale=SCALE) as h:
        runner = web_runner(h)
        # Nothing is submitted: both lanes' browsers start by themselves.
        await until(lambda: counter(h, "browser_prestarts") == 2, "both browsers pre-started")
        pids = runner.open_browsers()
        assert set(pids) == {"demo-1", "demo-2"}
        for account, pid in pids.items():
            # The one browser on the profile is the runner's, with its known PID.
            assert pid in {p.pid for p in account_browsers(h.state_dir, account)}
            assert unknown_browsers(h, account) == []
        assert await metric(h, "dispatcher_browser_prestarts_total") == 2.0
        # Beside the checked page a second tab, the model's page loaded in
        # it for the first task's spare: opened and loaded while the host is
        # quiet, not as the first tasks type.
        spares: dict[str, tuple[Page, Page, float]] = {}
        opened: list[Page] = []

        def on_page(page: Page) -> None:
            opened.append(page)

        for account in pids:
            session = runner.keeper.session(account)
            assert session is not None
            checked, spare = session.context.pages
            assert checked.url.endswith("/chat") and spare.url == checked.url
            spares[account] = (checked, spare, await spare.evaluate("performance.timeOrigin"))
            session.context.on("page", on_page)

        task = await h.submit("demo-chat", "the first task [duration=10]")
        done = await h.wait_task(task["id"], timeout_s=60)
        assert done["state"] == "success", done
        meta = done["result"]["meta"]
        account = meta["account"]
        assert (meta["browser_reused"], meta["browser_pid"]) == (True, pids[account])
        assert "launch" not in meta["timings_ms"]  # no start paid by the task
        # The next task's page is the spare loaded at the start: no tab
        # opened, and not loaded again (the same document).
        checked, spare, loaded = spares[account]
        session = runner.keeper.session(account)
        assert session is not None
        assert opened == [] and session.context.pages == [checked, spare]
        assert await spare.evaluate("performance.timeOrigin") == loaded

        # Taken out of service, an account gives its pre-started browser back.
        other = ({"demo-1", "demo-2"} - {account}).pop()
        await h.http.post(f"/v1/accounts/{other}/disable", json={"reason": "one account"})
        await until(lambda: account_browsers(h.state_dir, other) == [], f"{other}'s browser gone")
        assert other not in runner.open_browsers()
        assert await metric(h, "dispatcher_browser_reuses_total") == 1.0
        assert await metric(h, "dispatcher_browser_launches_total") == 2.0


async def test_with_prewarm_off_no_browser_opens_before_the_first_task(tmp_path: Path) -> None:
    async with running_service(
        tmp_path, profiles=("demo-chat",), time_scale=FIRST_START_SCALE, browser_prewarm=False
    ) as h:
        runner = web_runner(h)
        # A start would be under way by now: they are decided as the service starts.
        assert prewarm(h).starting == set()
        assert runner.open_browsers() == {}
        assert account_browsers(h.state_dir, "demo-1") == []
        await h.http.post("/v1/accounts/demo-2/disable", json={"reason": "one account"})
        task = await h.submit("demo-chat", "the first task [duration=10]")
        done = await h.wait_task(task["id"], timeout_s=60)
        assert (done["state"], done["result"]["meta"]["browser_reused"]) == ("success", False)
        assert counter(h, "browser_launches") == 1
        assert counter(h, "browser_prestarts") == 0


async def test_a_disabled_account_gets_no_browser_and_an_idle_one_is_closed(
    tmp_path: Path,
) -> None:
    state_dir = tmp_path / "state"
    # The switch persists across restarts; this first run only sets it (no
    # browser needed, so none is started).
    async with running_service(
        tmp_path, profiles=("demo-chat",), time_scale=SCALE, browser_prewarm=False
    ) as h:
        await h.http.post("/v1/accounts/demo-2/disable", json={"reason": "kept off"})
    async with running_service(
        tmp_path,
        profiles=("demo-chat",),
        time_scale=SCALE,
        state_dir=state_dir,
        browser_keep_alive_s=1.0,
    ) as h:
        runner = web_runner(h)
        assert prewarm(h).starting <= {"demo-1"}
        await until(lambda: counter(h, "browser_prestarts") == 1, "demo-1's browser pre-started")
        assert account_browsers(h.state_dir, "demo-2") == []
        # No task comes: after keep-alive it is closed like any idle kept browser.
        await until(lambda: account_browsers(h.state_dir, "demo-1") == [], "the idle browser gone")
        assert runner.open_browsers() == {}
        assert counter(h, "browser_launches") == 1


@asynccontextmanager
async def own_site(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[Settings, str]]:
    """Settings for a service (no --demo: no login is done for it) with one
    account, demo-1, on a demo web site started here, whose users the test
    sets up before the service starts."""
    site = await start_demo_web(time_scale=SCALE)
    monkeypatch.setenv("DEMO_WEB_URL", site.url)
    demo_chat_on(tmp_path, ("demo-1",))
    settings = Settings(
        state_dir=tmp_path / "state", profiles_dir=tmp_path / "profiles", time_scale=SCALE
    )
    try:
        yield settings, site.url
    finally:
        await site.stop()


async def log_in(browser: str, state_dir: Path, site: str) -> None:
    """What an operator (or the benchmark) does before starting the service."""
    assert await demo_login(browser, user_data_dir_for(state_dir, "demo-1"), f"{site}/chat")


@pytest.mark.parametrize(
    ("condition", "state", "reason"),
    [
        ("never logged in", "needs_attention", "logged out"),
        ("challenge", "needs_attention", "challenge"),
        ("limited", "cooldown", "usage limit"),
    ],
)
async def test_a_login_problem_at_start_goes_to_account_health_and_no_browser_stays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, condition: str, state: str, reason: str
) -> None:
    browser = find_browser()
    assert browser is not None
    async with own_site(tmp_path, monkeypatch) as (settings, site):
        if condition != "never logged in":
            await log_in(browser, settings.state_dir, site)
            body: dict[str, Any] = {"state": condition}
            if condition == "limited":
                body["reset_in_s"] = 3600
            async with httpx.AsyncClient() as client:
                (await client.post(f"{site}/__users/demo", json=body)).raise_for_status()
        async with serving(settings) as h:
            runner = web_runner(h)
            account = await h.wait_account("demo-1", state)
            assert reason in account["reason"], account
            await until(lambda: not prewarm(h).starting, "the start has ended")
            assert runner.open_browsers() == {}
            assert account_browsers(h.state_dir, "demo-1") == []
            assert (counter(h, "browser_launches"), counter(h, "browser_prestarts")) == (1, 0)

            # Its task waits, on its first attempt: nothing was spent on it.
            task = await h.submit("demo-chat", "waits for the account [duration=5]")
            lanes = {lane["name"]: lane for lane in (await h.http.get("/v1/lanes")).json()}
            assert lanes["web:demo-1"]["running"] == []
            held = await h.task(task["id"])
            assert (held["state"], held["attempt"], held["owner"]) == ("pending", 1, None)
            if condition != "never logged in":
                return

            # The operator logs it in and switches it back on: the browser is
            # started again for it and the task runs, still on attempt 1.
            async with runner.logins.hold_profile("demo-1") as profile:
                assert await demo_login(
                    browser, profile, f"{site}/chat", playwright=runner.playwright
                )
            await h.http.post("/v1/accounts/demo-1/enable")
            done = await h.wait_task(task["id"], timeout_s=60)
            assert (done["state"], done["attempt"]) == ("success", 1), done
            # One browser at start, one after (pre-started, or the task's own
            # if it took the profile first).
            assert counter(h, "browser_launches") == 2
            assert (await h.accounts())["demo-1"]["state"] == "ok"


async def test_an_account_removed_while_its_start_finds_it_logged_out_stays_removed(
    tmp_path: Path,
) -> None:
    """An account added before its login (the usual order) is found logged out
    by its browser's start, which then marks it as needing attention. A
    removal landing meanwhile must not be undone by that mark: the store
    may yield while writing it (PostgreSQL does), held open here."""
    async with running_service(tmp_path, profiles=("demo-chat",), time_scale=SCALE) as h:
        await h.browsers_started()
        store = h.service.store
        upsert = store.upsert_account
        marking = asyncio.Event()
        go_on = asyncio.Event()

        async def slow_mark(account: Any) -> None:
            if account.name == "extra" and account.needs_attention and not marking.is_set():
                marking.set()
                await go_on.wait()  # the mark is being written
            await upsert(account)

        store.upsert_account = slow_mark  # type: ignore[method-assign]
        added = await h.http.post("/v1/accounts", json={"name": "extra", "models": ["demo-chat"]})
        assert added.status_code == 201, added.text
        await marking.wait()
        removing = asyncio.create_task(h.http.delete("/v1/accounts/extra"))
        await asyncio.sleep(0.3)  # the removal is under way (or done, without the fix)
        go_on.set()
        gone = await removing
        assert gone.status_code == 200, gone.text
        await until(lambda: not prewarm(h).starting, "the start has ended")
        assert "extra" not in await h.accounts()
        assert "extra" not in await store.get_accounts()
        assert account_browsers(h.state_dir, "extra") == []


async def test_a_store_failure_marking_an_account_after_its_start_is_logged_as_the_start_s(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The start is a background task nobody awaits: a failure to mark the
    account (the database away for a moment) is the job's to log, with its
    lane, not left for asyncio to report as an exception never retrieved."""
    async with running_service(tmp_path, profiles=("demo-chat",), time_scale=SCALE) as h:
        await h.browsers_started()
        store = h.service.store
        upsert = store.upsert_account

        async def failing_mark(account: Any) -> None:
            if account.name == "extra" and account.needs_attention:
                raise StoreError("the database went away")
            await upsert(account)

        store.upsert_account = failing_mark  # type: ignore[method-assign]
        added = await h.http.post("/v1/accounts", json={"name": "extra", "models": ["demo-chat"]})
        assert added.status_code == 201, added.text
        await until(
            lambda: any("its page, before any task" in r.getMessage() for r in caplog.records),
            "the start found the page logged out",
        )
        await until(lambda: not prewarm(h).starting, "the start has ended")
        gc.collect()  # a failed job nobody retrieved is reported when collected
        await asyncio.sleep(0)
        unretrieved = [r for r in caplog.records if "never retrieved" in r.getMessage()]
        assert unretrieved == []
        failed = [
            r
            for r in caplog.records
            if r.name == "dispatcher.accounts.warmup" and r.levelno >= logging.ERROR
        ]
        assert failed and "web:extra" in failed[0].getMessage(), caplog.text
        assert account_browsers(h.state_dir, "extra") == []


async def test_a_browser_closing_after_keep_alive_as_the_service_stops_closes_gracefully(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Keep-alive ran out and the browser is closing (Chromium writes the
    profile to disk as it exits) when the service stops: the stop waits for
    that close instead of cutting it short with a kill."""
    caplog.set_level(logging.INFO)
    async with running_service(
        tmp_path, profiles=("demo-chat",), time_scale=SCALE, browser_keep_alive_s=1.0
    ) as h:
        runner = web_runner(h)
        await until(lambda: counter(h, "browser_prestarts") == 2, "both browsers pre-started")
        wait_exit = BrowserSession._wait_exit
        closing: list[int] = []
        reached = asyncio.Event()
        go_on = asyncio.Event()

        async def slow_exit(self: BrowserSession, until_s: float) -> bool:
            if not closing:
                closing.append(self.pid)
                reached.set()
                await go_on.wait()  # Chromium is still flushing its profile
            return await wait_exit(self, until_s)

        monkeypatch.setattr(BrowserSession, "_wait_exit", slow_exit)
        await reached.wait()  # one browser's keep-alive ran out: it is closing
        keeper = runner.keeper
        keeper_aclose = keeper.aclose
        stopping = asyncio.Event()

        async def aclose() -> None:
            stopping.set()
            await keeper_aclose()

        keeper.aclose = aclose  # type: ignore[method-assign]
        stop = asyncio.create_task(h.service.stop())
        await stopping.wait()
        await asyncio.sleep(0.2)  # the stop is under way (or done, without the fix)
        go_on.set()
        await stop
        closed = [
            r.getMessage() for r in caplog.records if f"pid {closing[0]} closed" in r.getMessage()
        ]
        assert closed and "gracefully" in closed[0], caplog.text
        assert account_browsers(h.state_dir, "demo-1") == []
        assert account_browsers(h.state_dir, "demo-2") == []
