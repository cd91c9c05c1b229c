"""The browser memory budget with real Chromium: a start over the budget closes
the least recently used idle browser, never a running one, and waits while
only running browsers could make room."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import pytest

from demo.web_model import demo_login
from dispatcher.models import Stage
from dispatcher.scheduling.protocol import Interruption

if TYPE_CHECKING:
    from tests.integration.webrunner.conftest import WebEnv
    from webrunner.runner import WebRunner

pytestmark = [
    pytest.mark.browser,
    pytest.mark.asyncio(loop_scope="session"),
    pytest.mark.timeout(300),
]

ACCOUNTS = ("demo-1", "demo-2", "demo-3")
# Nominal seconds (x 0.05): a generation that holds its browser 200 s, far
# longer than the test, which ends it by a cancel. Its attempt's timeout is
# longer still: the profile's 600 s (30 s here) ended demo-1's generation
# before the test did on a loaded CI run, and closed its browser with it.
LONG_S = 4000


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
    # A start decides on the footprints the test set the budget from: one
    # measured again later differs (PSS splits Chromium's shared pages among
    # every process mapping them, other tests' browsers too), and on a slow
    # machine the start came more than the usual 5 s after the test's look.
    runner.memory.measure_ttl_s = 3600.0
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
    # Both measured now (demo-1's last look was before demo-2's browser shared its pages).
    runner.memory.forget_measurements()
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
    long2 = LongRun(web, runner, "demo-2")
    long1: LongRun | None = None
    try:
        await long2.generating()
        # PSS shares a library's pages among the processes mapping it: with a
        # third browser open each one counts less than before. Measured
        # afresh, room for what is open now and half a browser again.
        runner.memory.forget_measurements()
        view = await runner.memory_view()
        assert view is not None
        runner.memory.budget_bytes = view.total_bytes + max(view.browsers.values()) // 2
        await run_on(web, runner, "demo-1", "fourth [duration=1]")
        assert set(runner.open_browsers()) == {"demo-1", "demo-2"}
        assert runner.open_browsers()["demo-2"] == kept["demo-2"]
        assert not long2.run.done(), "the running generation was cut short"
        assert runner.stats().counters["browsers_closed_for_memory"] == 2

        # demo-1 runs a long generation too: with both running and nothing
        # idle to close, demo-3's start waits, until demo-2's task ends
        # (canceled: its browser is closed with it).
        long1 = LongRun(web, runner, "demo-1")
        await long1.generating()
        ctx3, recorder3 = web.context(web.task("fifth [duration=1]"), "demo-3")
        third = asyncio.create_task(runner.run(ctx3.task, ctx3))
        await asyncio.sleep(2.0)  # real seconds: a few of the waiting start's looks
        assert not third.done()
        assert Stage.GENERATING not in [stage for stage, _, _ in recorder3.stages]
        assert set(runner.open_browsers()) == {"demo-1", "demo-2"}
        await long2.cancel()
        await third
        assert set(runner.open_browsers()) == {"demo-1", "demo-3"}
        assert not long1.run.done(), "demo-1's generation was cut short"
    finally:
        for long_run in (long2, long1):
            if long_run is not None:
                await long_run.cancel()
    assert runner.stats().counters["browsers_closed_for_memory"] == 2
    assert (await web.stats())["collisions"] == 0


class LongRun:
    """A generation far longer than the test, ended by an operator's cancel."""

    def __init__(self, web: WebEnv, runner: WebRunner, account: str) -> None:
        # Many words: the answer keeps moving (a still one would read as stalled).
        words = " ".join(f"w{i}" for i in range(400))
        task = web.task(f"long {words} [duration={LONG_S}]")
        self.ctx, self.recorder = web.context(task, account, timeout_s=2 * LONG_S)
        self.run = asyncio.create_task(runner.run(task, self.ctx))

    async def generating(self) -> None:
        await self.recorder.wait_for_stage(Stage.GENERATING)

    async def cancel(self) -> None:
        if not self.run.done():
            self.ctx.interrupt(Interruption.CANCELED)
        await asyncio.gather(self.run, return_exceptions=True)
