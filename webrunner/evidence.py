"""What a web attempt that went wrong looked like: screenshot, HTML, trace.

Called from the runner's failure, cancel and reclaim paths, before the
browser is closed. Everything here is bounded in time: the page may be the
very one that froze (a renderer in `while (true) {}` answers no call), and
the cleanup that follows must not wait on it. Nothing here raises: a capture
that fails only leaves less to look at.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from playwright.async_api import BrowserContext, Page
from playwright.async_api import Error as PlaywrightError

from dispatcher.artifacts import (
    MAX_HTML_BYTES,
    Retention,
    artifacts_dir,
    capped_text,
    prune,
    results_root,
    save_artifact,
)
from webrunner.browser import Log

# Real seconds for the screenshot and the HTML together.
CAPTURE_S = 2.0
# Real seconds for writing the trace (it is assembled in the browser's driver).
TRACE_STOP_S = 5.0


async def start_trace(context: BrowserContext, log: Log) -> bool:
    """Start recording a Playwright trace of the attempt; False if it would not start."""
    try:
        async with asyncio.timeout(CAPTURE_S):
            await context.tracing.start(screenshots=True, snapshots=True)
    except (PlaywrightError, TimeoutError) as exc:
        log.warning("could not start a trace: %s", exc)
        return False
    return True


async def drop_trace(context: BrowserContext) -> None:
    """End a trace nobody needs (the attempt succeeded)."""
    with contextlib.suppress(PlaywrightError, TimeoutError):
        async with asyncio.timeout(TRACE_STOP_S):
            await context.tracing.stop()


async def _snapshot(page: Page) -> tuple[bytes | None, str | None]:
    shot, html = await asyncio.gather(
        page.screenshot(type="png", timeout=CAPTURE_S * 1000, animations="disabled"),
        page.content(),
        return_exceptions=True,
    )
    return (
        shot if isinstance(shot, bytes) else None,
        html if isinstance(html, str) else None,
    )


async def capture(
    result_dir: Path,
    page: Page | None,
    context: BrowserContext | None,
    *,
    tracing: bool,
    retention: Retention,
    log: Log,
) -> list[str]:
    """Save what the page shows now under the attempt's artifacts; the names saved."""
    saved: list[str] = []
    shot: bytes | None = None
    html: str | None = None
    if page is not None and not page.is_closed():
        task = asyncio.ensure_future(_snapshot(page))
        done, _ = await asyncio.wait({task}, timeout=CAPTURE_S)
        if done:
            shot, html = task.result()
        else:
            task.cancel()
            # Playwright gives up on a cancelled call at once; bounded anyway.
            await asyncio.wait({task}, timeout=0.5)
            log.warning("the page did not answer within %.0f s: no screenshot or HTML", CAPTURE_S)
    if shot is not None:
        await asyncio.to_thread(save_artifact, result_dir, "screenshot.png", shot)
        saved.append("screenshot.png")
    if html is not None:
        data = capped_text(html, MAX_HTML_BYTES)
        await asyncio.to_thread(save_artifact, result_dir, "page.html", data)
        saved.append("page.html")
    if tracing and context is not None and await _save_trace(result_dir, context, log):
        saved.append("trace.zip")
    if saved:
        removed = await asyncio.to_thread(prune, results_root(result_dir), retention)
        if removed:
            log.info("artifacts of %d older attempts deleted (retention)", len(removed))
        log.info("kept %s in %s", ", ".join(saved), artifacts_dir(result_dir))
    return saved


async def _save_trace(result_dir: Path, context: BrowserContext, log: Log) -> bool:
    # The driver writes the file; it goes to a scratch name first so that a
    # trace cut short by the timeout is never served.
    target = artifacts_dir(result_dir)
    await asyncio.to_thread(target.mkdir, parents=True, exist_ok=True)
    scratch = target / ".trace.zip.part"
    try:
        async with asyncio.timeout(TRACE_STOP_S):
            await context.tracing.stop(path=scratch)
        await asyncio.to_thread(scratch.replace, target / "trace.zip")
        return True
    except (PlaywrightError, TimeoutError, OSError) as exc:
        log.warning("could not save the trace: %s", exc)
        with contextlib.suppress(OSError):
            scratch.unlink()
        return False
