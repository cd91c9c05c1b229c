"""The browser memory budget with real Chromium: a start over the budget closes
the least recently used idle browser, never a running one, and waits while
only running browsers could make room."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import pytest

from demo.web_model import demo_login
from dispatcher.models import Stage

if TYPE_CHECKING:
    from tests.integration.webrunner.conftest import WebEnv
    from webrunner.runner import WebRunner

pytestmark = [pytest.mark.browser, pytest.mark.asyncio(loop_scope="session")]

ACCOUNTS = ("demo-1", "demo-2", "demo-3")
# Nominal seconds (x 0.05): a generation that holds its browser ~20 s.
LONG_S = 300


async def three_accounts(web: WebEnv) -> WebRunner:
    """A runner serving demo-chat on three accounts, each logged in as its own
    demo user (one session each: generations on two of them never collide)."""
    for account in ACCOUNTS[1:]:
        await demo_login(
            web.browser,
            web.user_data_dir(account),
            f"{web.url}/chat",
            username=account,
            playwright=web.driver,
        )
    runner = await web.runner(browser_keep_alive_s=600.0)
    runner.add_owner("demo-3")
    runner.serve({account: ("demo-chat",) for account in ACCOUNTS})
    return runner


async def run_on(web: WebEnv, runner: WebRunner, account: str, prompt: str) -> None:
    task = web.task(prompt)
    ctx, _ = web.context(task, account)
    await runner.run(task, ctx)


async def test_a_start_over_the_budget_closes_the_least_recently_used_idle_browser(
    web: WebEnv,
) -> None:
    runner = await three_accounts(web)
    await run_on(web, runner, "demo-1", "first [duration=1]")
    await run_on(web, runner, "demo-2", "second [duration=1]")
    kept = runner.open_browsers()
    assert set(kept) == {"demo-1", "demo-2"}
    view = await runner.memory_view()
    assert view is not None and set(view.browsers) == {"demo-1", "demo-2"}
    # Room for the service and two browsers and a half: a third start must
    # close one of the two, and it is demo-1's, handed back the longest ago.
    largest = max(view.browsers.values())
    runner.memory.budget_bytes = view.total_bytes + largest // 2
    await run_on(web, runner, "demo-3", "third [duration=1]")
    assert set(runner.open_browsers()) == {"demo-2", "demo-3"}
    assert runner.open_browsers()["demo-2"] == kept["demo-2"]
    assert runner.stats().counters["browsers_closed_for_memory"] == 1
    assert not web.browser_pids("demo-1"), "the closed browser left processes behind"

    # demo-2 now runs a long generation; it was handed back before demo-3,
    # so it is the least recently used, but busy: demo-1's start closes
    # demo-3's idle browser instead.
    task = web.task(f"long [duration={LONG_S}]")
    ctx, recorder = web.context(task, "demo-2")
    long_run = asyncio.create_task(runner.run(task, ctx))
    runs: list[asyncio.Task[object]] = []
    try:
        await recorder.wait_for_stage(Stage.GENERATING)
        await run_on(web, runner, "demo-1", "fourth [duration=1]")
        assert set(runner.open_browsers()) == {"demo-1", "demo-2"}
        assert runner.open_browsers()["demo-2"] == kept["demo-2"]
        assert not long_run.done(), "the running generation was cut short"
        assert runner.stats().counters["browsers_closed_for_memory"] == 2

        # demo-1 runs a long generation too: with both running, demo-3's
        # start waits (nothing idle to close), until demo-2's generation ends
        # and its browser, handed back, is closed for it.
        task1 = web.task(f"long too [duration={LONG_S}]")
        ctx1, recorder1 = web.context(task1, "demo-1")
        runs.append(asyncio.create_task(runner.run(task1, ctx1)))
        await recorder1.wait_for_stage(Stage.GENERATING)
        task3 = web.task("fifth [duration=1]")
        ctx3, recorder3 = web.context(task3, "demo-3")
        runs.append(asyncio.create_task(runner.run(task3, ctx3)))
        await asyncio.sleep(2.0)  # real seconds: a few of the waiting start's looks
        assert not long_run.done(), "demo-2's generation ended too soon for this test"
        assert Stage.GENERATING not in [stage for stage, _, _ in recorder3.stages]
        assert set(runner.open_browsers()) == {"demo-1", "demo-2"}
        await long_run
        await runs[-1]  # demo-3's task, once demo-2's browser made room
        assert not runs[0].done(), "demo-1's generation was cut short"
        assert set(runner.open_browsers()) == {"demo-1", "demo-3"}
        await runs[0]
    finally:
        for run in [long_run, *runs]:
            if not run.done():
                run.cancel()
    assert runner.stats().counters["browsers_closed_for_memory"] == 3
    assert (await web.stats())["collisions"] == 0
