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
from collections.abc import Awaitable
from pathlib import Path
from typing import TypeVar

from playwright.async_api import BrowserContext, Page
from playwright.async_api import Error as PlaywrightError

from dispatcher.tasks.artifacts import (
    MAX_HTML_BYTES,
    Retention,
    artifacts_dir,
    capped_text,
    prune,
    results_root,
    save_artifact,
)
from webrunner.browser import Log

T = TypeVar("T")

# Real seconds for the screenshot, and apart from it for the HTML: a tab in
# the back while a spare tab loads the next task's page took 3.7 s for its
# screenshot on a busy 2-core VM; the HTML takes ~50 ms and must not be lost
# with it.
SCREENSHOT_S = 4.0
HTML_S = 2.0
# Real seconds for starting a trace.
CAPTURE_S = 2.0
# Real seconds a cancelled capture gets to end (Playwright gives up at once).
ABANDON_S = 0.5
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


async def _bounded(work: Awaitable[T], bound_s: float) -> T | BaseException:
    """`work`'s result within `bound_s` real seconds, or what stopped it."""
    task = asyncio.ensure_future(work)
    done, _ = await asyncio.wait({task}, timeout=bound_s)
    if not done:
        task.cancel()
        await asyncio.wait({task}, timeout=ABANDON_S)
        return TimeoutError()
    if task.cancelled():
        return TimeoutError()
    exc = task.exception()
    return exc if exc is not None else task.result()


async def _screenshot(page: Page) -> bytes:
    # The task's tab may be in the back (a spare tab opened after it): a tab
    # in the back paints no frames, and a screenshot waits for one.
    await page.bring_to_front()
    return await page.screenshot(type="png", timeout=SCREENSHOT_S * 1000, animations="disabled")


# The page's HTML as `page.content()` serialises it, cut in the page: the
# DOM of an untrusted page may be any size, and only MAX_HTML_BYTES of it
# are kept. Its full length comes along, for the note on the cut.
_HTML_JS = """(maxChars) => {
  let html = document.doctype ? new XMLSerializer().serializeToString(document.doctype) : '';
  if (document.documentElement) html += document.documentElement.outerHTML;
  return [html.slice(0, maxChars), html.length];
}"""


async def _html(page: Page) -> str:
    # Room for the note on the cut, which the artifact's own cap keeps then.
    answer = await page.evaluate(_HTML_JS, MAX_HTML_BYTES - 1024)
    if not (isinstance(answer, list) and len(answer) == 2 and isinstance(answer[0], str)):
        raise ValueError("the page answered its HTML in an unexpected shape")
    html, length = str(answer[0]), answer[1]
    if isinstance(length, int) and length > len(html):
        html += f"\n<!-- cut here: the page's HTML is {length:,} characters -->\n"
    return html


async def _snapshot(page: Page, log: Log) -> tuple[bytes | None, str | None]:
    """The page's screenshot and HTML, each within its own bound."""
    shot, html = await asyncio.gather(
        _bounded(_screenshot(page), SCREENSHOT_S), _bounded(_html(page), HTML_S)
    )
    for name, got, bound_s in (("screenshot", shot, SCREENSHOT_S), ("HTML", html, HTML_S)):
        if isinstance(got, TimeoutError):
            log.warning("the page did not answer within %g s: no %s", bound_s, name)
        elif isinstance(got, BaseException):
            log.warning(
                "no %s of the page: %s", name, (str(got) or repr(got)).splitlines()[0][:200]
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
        shot, html = await _snapshot(page, log)
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
