"""The web runner against the demo web model, with a real headless Chromium."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from dispatcher.errors import AuthError, LockHeld, TaskCanceled, TransientError
from dispatcher.models import Stage
from dispatcher.scheduling.protocol import Interruption
from webrunner import keeper
from webrunner.browser import DEBUGGING_PIPE_FLAG, chromium_flags

if TYPE_CHECKING:
    from playwright.async_api import Page

    from tests.integration.webrunner.conftest import WebEnv
    from webrunner.runner import WebRunner

pytestmark = [pytest.mark.browser, pytest.mark.asyncio(loop_scope="session")]


def _read(path: str) -> bytes:
    return Path(path).read_bytes()


def _start_chromium(browser: str, profile: Path, log_path: Path) -> subprocess.Popen[bytes]:
    """What a killed dispatcher leaves behind: a Chromium still on the profile."""
    with log_path.open("wb") as stderr:
        return subprocess.Popen(
            # A browser of an older version: a debugging port, no pipe.
            [
                browser,
                *(f for f in chromium_flags(profile) if f != DEBUGGING_PIPE_FLAG),
                "--remote-debugging-port=0",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,
        )


async def test_instructions_unless_need_empty_prompt_and_a_second_runner_is_refused(
    web: WebEnv,
) -> None:
    runner = await web.runner()

    chat = web.task("hello there [duration=30]", model="demo-chat")  # 1.5 s at this scale
    ctx, recorder = web.context(chat)
    run = asyncio.create_task(runner.run(chat, ctx))
    try:
        await recorder.wait_for_stage(Stage.GENERATING)
        # Another dispatcher on the same state dir wants the same accounts
        # while a task runs: it is refused, and the running task is untouched.
        second = web.new_runner()
        with pytest.raises(LockHeld) as caught:
            await second.start()
        message = str(caught.value)
        assert "'demo-1'" in message and "another dispatcher" in message
        await second.aclose()
    finally:
        result = await run
    assert result.text == "(brief) echo: hello there"
    assert result.files == []
    assert result.meta["account"] == "demo-1"
    assert result.meta["browser_reused"] is False
    # The browser stays open for the next task, and it is the only one.
    assert web.browser_pids() and web.unknown_browser_pids(runner) == []

    reasoner = web.task("hello there", model="demo-reasoner")  # submits with Enter
    ctx, _ = web.context(reasoner)
    result = await runner.run(reasoner, ctx)
    assert result.text == "echo: hello there"  # no "(step by step)": nothing prepended
    assert result.meta["browser_reused"] is True
    assert (
        runner.stats().counters["browser_launches"] == 1
        and runner.stats().counters["browser_reuses"] == 1
    )

    stats = await web.stats()
    assert stats["generations"] == 2
    assert stats["collisions"] == 0
    assert stats["logins"] == 0  # the copied profile was logged in already
    await runner.aclose()
    assert web.browser_pids() == []


async def test_an_idle_browser_is_closed_and_a_dead_one_replaced(web: WebEnv) -> None:
    runner = await web.runner(browser_keep_alive_s=1.0)
    first = web.task("one")
    result = await runner.run(first, web.context(first)[0])
    pid = result.meta["browser_pid"]
    assert runner.open_browsers() == {"demo-1": pid}

    # Killed behind our back while idle (OOM killer, an operator): the next
    # task notices and starts a fresh browser instead of failing.
    os.kill(pid, signal.SIGKILL)
    second = web.task("two")
    result = await runner.run(second, web.context(second)[0])
    assert result.text == "(brief) echo: two"
    assert result.meta["browser_reused"] is False and result.meta["browser_pid"] != pid
    assert web.survivors([pid]) == []

    deadline = time.monotonic() + 30
    while web.browser_pids():
        assert time.monotonic() < deadline, "the idle browser was never closed"
        await asyncio.sleep(0.1)
    assert runner.open_browsers() == {}
    assert runner.stats().counters["browser_launches"] == 2


async def _tabs_during_generation(web: WebEnv, runner: WebRunner, prompt: str) -> int:
    """Run one task; the most tabs its browser had open while it generated."""
    task = web.task(prompt)
    ctx, recorder = web.context(task)
    run = asyncio.create_task(runner.run(task, ctx))
    await recorder.wait_for_stage(Stage.GENERATING)
    most = 0
    while not run.done():
        session = runner.running_browser("demo-1")
        if session is not None:
            most = max(most, len(session.context.pages))
        await asyncio.sleep(0.02)
    assert (await run).text == f"(brief) echo: {prompt.split(' [')[0]}"
    return most


async def test_the_next_page_loads_in_a_spare_tab_unless_generations_run_long(
    web: WebEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = await web.runner()
    # While the first task generates, the next task's page loads beside it.
    assert await _tabs_during_generation(web, runner, "one [duration=30]") == 2
    session = runner.keeper.session("demo-1")
    assert session is not None
    # The finished conversation's tab stays, parked: the next spare loads in it.
    tabs = list(session.context.pages)
    assert len(tabs) == 2
    fresh = [tab for tab in tabs if await tab.locator(".msg").count() == 0]
    assert [tab.url for tab in fresh] == [f"{web.url}/chat"]
    opened: list[Page] = []

    def on_page(page: Page) -> None:
        opened.append(page)

    session.context.on("page", on_page)

    # The next tasks take turns in the same two tabs: no tab opened, none closed.
    assert await _tabs_during_generation(web, runner, "two [duration=30]") == 2
    assert await _tabs_during_generation(web, runner, "three [duration=30]") == 2
    assert opened == [] and set(session.context.pages) == set(tabs)

    # Generations longer than half a pre-loaded page's freshness: no spare
    # (it would be stale by the end); the stale one is loaded again, and the
    # parked tab, which no spare will take, is closed.
    monkeypatch.setattr(keeper, "PRELOAD_FRESH_S", 0.5)
    assert await _tabs_during_generation(web, runner, "four [duration=30]") == 2
    deadline = time.monotonic() + 10
    while len(session.context.pages) > 1:
        assert time.monotonic() < deadline, "the parked tab stayed open"
        await asyncio.sleep(0.05)
    assert await _tabs_during_generation(web, runner, "five [duration=30]") == 1
    stats = await web.stats()
    assert stats["generations"] == 5 and stats["collisions"] == 0
    assert runner.stats().counters["browser_launches"] == 1
    await runner.aclose()


async def test_a_busy_page_costs_a_look_as_it_starts_and_ends_not_a_poll_while_it_runs(
    web: WebEnv,
) -> None:
    # Looks at a busy page only every ~17 min (a quarter of stall_s): the
    # end must come from the page itself, and the cost of the generation
    # must not grow with its length.
    chat = web.profiles["demo-chat"]
    assert chat.web is not None
    web.profiles["demo-chat"] = chat.model_copy(
        update={"web": chat.web.model_copy(update={"stall_s": 80_000.0})}
    )
    runner = await web.runner(browser_keep_alive_s=0.0)  # no spare tab loading meanwhile
    task = web.task("count the words one by one [duration=80]")  # 4 s at this scale
    ctx, recorder = web.context(task)
    run = asyncio.create_task(runner.run(task, ctx))
    try:
        await recorder.wait_for_stage(Stage.GENERATING)
        session = runner.running_browser("demo-1")
        assert session is not None
        sent_before = session.pipe.commands
        async with asyncio.timeout(60):
            result = await asyncio.shield(run)
        sent = session.pipe.commands - sent_before
    finally:
        if not run.done():
            run.cancel()
        await asyncio.gather(run, return_exceptions=True)
    assert result.text == "(brief) echo: count the words one by one"
    # A look (~15 page calls, a few protocol commands each) as it starts and
    # one as it ends, one wait in the page between them, then the close:
    # ~120. Playwright's wait_for polled every 20 ms instead, three commands
    # each: ~600 in these 4 s.
    assert sent < 250, sent
    assert (await web.stats())["collisions"] == 0


async def test_media_answers_arrive_as_files(web: WebEnv) -> None:
    runner = await web.runner()
    task = web.task("a cat [media=image,video]")
    ctx, recorder = web.context(task)
    result = await runner.run(task, ctx)

    assert result.text == "(brief) echo: a cat"
    assert [f.content_type for f in result.files] == ["image/png", "video/mp4"]
    contents = [_read(file.path) for file in result.files]
    for file, data in zip(result.files, contents, strict=True):
        assert Path(file.path).parent == ctx.result_dir
        assert file.size == len(data) > 0
        assert file.sha256 == hashlib.sha256(data).hexdigest()
    assert contents[0].startswith(b"\x89PNG\r\n\x1a\n")
    assert contents[1][4:8] == b"ftyp"
    assert "downloading" in recorder.stage_names
    assert (await web.stats())["collisions"] == 0


async def test_an_expired_session_fails_with_auth_error(web: WebEnv) -> None:
    runner = await web.runner()
    await web.set_mode("expired")
    task = web.task("hello")
    ctx, _ = web.context(task)
    with pytest.raises(AuthError) as caught:
        await runner.run(task, ctx)
    assert caught.value.kind == "auth"
    assert "logged out" in str(caught.value) and "demo-1" in str(caught.value)
    assert (await web.stats())["generations"] == 0  # nothing was sent
    assert web.browser_pids() == []


async def test_an_error_banner_fails_the_attempt_with_its_text(web: WebEnv) -> None:
    runner = await web.runner()
    await web.set_mode("error", message="Quota exceeded (code 17), try later")
    task = web.task("hello")
    ctx, _ = web.context(task)
    with pytest.raises(TransientError) as caught:
        await runner.run(task, ctx)
    assert caught.value.kind == "page_error"
    assert caught.value.retryable
    assert "Quota exceeded (code 17), try later" in str(caught.value)
    assert web.browser_pids() == []


async def test_cancel_mid_generation_clicks_stop_and_closes_the_browser(web: WebEnv) -> None:
    runner = await web.runner()
    task = web.task("a long story [duration=400]")  # 20 s at this scale
    ctx, recorder = web.context(task)
    run = asyncio.create_task(runner.run(task, ctx))
    try:
        await recorder.wait_for_stage(Stage.GENERATING)
        await asyncio.sleep(0.3)
        pids = web.browser_pids()
        assert pids, "the task's browser should be running"
        assert (await web.stats())["active"] == 1
    except BaseException:
        run.cancel()
        await asyncio.gather(run, return_exceptions=True)
        raise

    started = time.monotonic()
    ctx.interrupt(Interruption.CANCELED)
    with pytest.raises(TaskCanceled):
        await run
    elapsed = time.monotonic() - started
    # Noticed at once; then the stop click and a graceful close (up to 3 s,
    # then a kill). Well short of the 20 s answer even on a busy machine.
    assert elapsed < 15, elapsed

    stats = await web.stats()
    assert stats["stops"] == 1
    assert stats["active"] == 0
    assert stats["collisions"] == 0
    assert web.survivors(pids) == []
    assert web.browser_pids() == []


async def test_a_leftover_browser_on_the_profile_is_ended_by_the_self_check(
    web: WebEnv, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=web.log_name)
    profile = web.user_data_dir()
    log_path = profile.parent / "leftover.log"
    leftover = _start_chromium(web.browser, profile, log_path)
    try:
        deadline = time.monotonic() + 60
        while "DevTools listening" not in log_path.read_text(errors="replace"):
            assert leftover.poll() is None and time.monotonic() < deadline
            await asyncio.sleep(0.05)
        assert leftover.pid in web.browser_pids()

        runner = await web.runner()
        task = web.task("after a crash")
        ctx, _ = web.context(task)
        result = await runner.run(task, ctx)
        assert result.text == "(brief) echo: after a crash"
        assert leftover.wait(timeout=10) is not None
    finally:
        if leftover.poll() is None:
            leftover.kill()
            leftover.wait()

    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert f"[web:demo-1] self-check of {profile}" in logged
    assert re.search(rf"found 1 leftover browser process\(es\) \[pid {leftover.pid} ", logged)
    assert web.unknown_browser_pids(runner) == []


async def test_a_frozen_page_stops_the_beats_and_cancellation_kills_the_browser(
    web: WebEnv,
) -> None:
    runner = await web.runner()
    task = web.task("freeze [mode=hang]")
    ctx, _ = web.context(task)
    run = asyncio.create_task(runner.run(task, ctx))
    try:
        deadline = time.monotonic() + 25  # the profile's timeout is 30 s at this scale
        while (await web.stats())["generations"] == 0:
            assert time.monotonic() < deadline and not run.done(), run
            await asyncio.sleep(0.05)
        # Beats come with every page call that returns (several a second)
        # until the renderer freezes (the submit click itself may be the call
        # that never returns); then they stop for good.
        quiet_since, last = time.monotonic(), ctx.last_beat_monotonic
        while time.monotonic() - quiet_since < 2.0:
            assert time.monotonic() < deadline, "beats never stopped"
            assert not run.done(), run
            await asyncio.sleep(0.05)
            if ctx.last_beat_monotonic != last:
                quiet_since, last = time.monotonic(), ctx.last_beat_monotonic
        pids = web.browser_pids()
        assert pids
    finally:
        # The core's stale rule: cancel the coroutine, then free the account.
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run
    assert web.survivors(pids) == []
    assert web.browser_pids() == []
