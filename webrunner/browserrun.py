"""What one web attempt holds in its browser, and the accounting of its close."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from playwright.async_api import Page

from dispatcher.errors import RunError, TransientError
from dispatcher.profiles import WebSpec
from dispatcher.scheduling.protocol import ResultFile, RunResult
from dispatcher.tasks.artifacts import Retention
from webrunner import evidence
from webrunner.browser import BrowserSession, Log
from webrunner.gates import worth_a_login_look
from webrunner.page import PageDriver

T = TypeVar("T")
# Real seconds between two looks at a kept browser's process while a page
# call on it is awaited (`while_alive`).
DEAD_LOOK_S = 0.25


@dataclass
class BrowserRun:
    """What one attempt holds in the browser, for its failure and clean-up paths."""

    account: str
    session: BrowserSession | None = None
    reused: bool = False
    driver: PageDriver | None = None
    page: Page | None = None  # the tab `driver` is being made for
    tracing: bool = False
    kept: bool = False  # handed to the keeper for the account's next task


def run_result(
    run: BrowserRun,
    text: str | None,
    files: list[ResultFile],
    marks: tuple[float, float, float, float],
) -> RunResult:
    """An answered attempt's result; `marks` are when it began, had its page
    ready, had sent the prompt and saw the answer finished (monotonic s)."""
    session = run.session
    assert session is not None
    began, ready, submitted, answered = marks
    timings = {
        **({} if run.reused else session.timings_ms),
        "ready": (ready - began) * 1000,
        # Typing and sending, part of `generation` (which runs until the
        # answer was seen finished).
        "submit": (submitted - ready) * 1000,
        "generation": (answered - ready) * 1000,
    }
    return RunResult(
        text=text,
        files=files,
        meta={
            "account": run.account,
            "browser_pid": session.pid,
            "browser_reused": run.reused,
            "timings_ms": {k: round(v, 1) for k, v in timings.items()},
            "selfcheck": None
            if run.reused or session.selfcheck.clean
            else session.selfcheck.to_json(),
        },
    )


def add_close_timings(result: RunResult, run: BrowserRun) -> None:
    """What this task paid beyond the generation: browser start (unless
    reused) and page load before the prompt, close after the answer."""
    timings_ms = result.meta["timings_ms"]
    session = run.session
    close_ms = 0.0 if run.kept or session is None else session.timings_ms.get("close", 0.0)
    timings_ms["close"] = round(close_ms, 1)
    timings_ms["overhead"] = round(timings_ms["ready"] + close_ms, 1)


async def close_logged(session: BrowserSession, log: Log) -> None:
    """Close the browser (graceful, then kill) and say how it went."""
    graceful = await session.close(log)
    log.info(
        "browser pid %d closed %s in %.0f ms",
        session.pid,
        "gracefully" if graceful else "by kill",
        session.timings_ms.get("close", 0.0),
    )
    if session.survivors:
        log.error(
            "browser processes %s of profile %s survived SIGKILL",
            session.survivors,
            session.user_data_dir,
        )


async def keep_evidence(run: BrowserRun, result_dir: Path, retention: Retention, log: Log) -> None:
    """Screenshot, HTML (and trace) of the attempt's own tab, bounded; see `evidence`."""
    session, driver = run.session, run.driver
    if session is None or not session.usable:
        return
    # Without a driver the attempt failed while opening the page (logged
    # out, the page never became ready): its tab still shows why. (The
    # browser may hold other tabs: a spare, a conversation being closed.)
    pages = session.context.pages
    page = driver.page if driver is not None else run.page or (pages[0] if pages else None)
    await evidence.capture(
        result_dir, page, session.context, tracing=run.tracing, retention=retention, log=log
    )


async def login_look(
    run: BrowserRun, spec: WebSpec | None, error: RunError, log: Log
) -> RunError | None:
    """The logout (or other hold on the account) that the failed attempt's
    page shows once loaded again, if any: then the account, not the task,
    pays for the failure (`gates.worth_a_login_look`)."""
    driver, session = run.driver, run.session
    if spec is None or driver is None or not worth_a_login_look(spec, error):
        return None
    if session is None or not session.usable:
        return None
    held = await driver.logged_out_on_reload()
    if held is not None:
        log.warning(
            "the page, loaded again after the failure, shows the account's session gone "
            "(%s): no attempt charged",
            held.kind,
        )
    return held


async def while_alive(session: BrowserSession, work: Awaitable[T]) -> T:
    """`work`, unless the browser's process exits first: a kept browser
    killed while idle (the OOM killer, an operator) may leave its pipe open
    in a surviving child for a while, and a page call on it waits without
    a timeout of its own. The caller then starts a new browser."""
    job = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({job}, timeout=DEAD_LOOK_S)
            if done:
                return job.result()
            if not session.alive:
                raise TransientError(
                    f"the kept browser (pid {session.pid}) has exited", kind="browser"
                )
    finally:
        if not job.done():
            job.cancel()
            with contextlib.suppress(BaseException):
                await job
