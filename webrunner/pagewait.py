"""Waiting for a page to change, in the page: a generating page's busy marker.

Playwright's `wait_for` re-reads the page over the protocol every 20 ms
(three DevTools commands each) when its timeout is short: for twenty
generating pages on two cores that polling was most of the CPU (BENCHMARKS.md,
finding 11). A wait that runs in the page wakes on the page's own DOM
changes: it costs the browser nothing while nothing changes, and one call.
"""

from __future__ import annotations

from typing import Literal

from playwright.async_api import Locator

from dispatcher.errors import TransientError
from webrunner.pagestep import Budget, PageContext, navigated, page_step
from webrunner.snapshot import PICK_JS

# Real seconds between two full looks while the page shows itself busy: the
# end of a generation (the busy marker going) wakes the loop at once from the
# page (`_UNTIL_SHOWN_CHANGES_JS`), so these looks are only for what a busy
# page may show without ending (an error banner, a cap, a stalled answer).
MAX_BUSY_LOOK_S = 1.0
# Real seconds a wait in the page may overrun its own timer (a renderer busy
# with the page's script) before we stop waiting for it and look.
PAGE_WAIT_SLACK_S = 0.5

# Resolves once the first element's visibility (as Playwright judges it: in the
# document, `visibility: visible`, a non-empty box) differs from `seen` (what
# the last look saw), or after `ms`; "gone" at once when there is no such
# element, "differs" at once when it differs already.
# It runs in the page and wakes on the page's own DOM changes: waiting costs
# the browser nothing and one protocol call, where Playwright's `wait_for`
# re-reads the page over the protocol every 20 ms (three calls each time).
_UNTIL_SHOWN_CHANGES_JS = """(els, [ms, seen]) => new Promise(resolve => {
    const el = els[0];
    if (!el) { resolve("gone"); return; }
    try {
        const shown = () => {
            if (!el.isConnected) return false;
            if (getComputedStyle(el).visibility !== "visible") return false;
            const box = el.getBoundingClientRect();
            return box.width > 0 && box.height > 0;
        };
        const before = shown();
        // Changed already since the look that saw it (`seen`): wake now.
        if (before !== seen) { resolve("differs"); return; }
        let timer = 0;
        const watch = new MutationObserver(() => {
            try { if (shown() !== before) end("changed"); } catch (e) { end("unavailable"); }
        });
        const end = why => { watch.disconnect(); clearTimeout(timer); resolve(why); };
        watch.observe(document, {subtree: true, childList: true, attributes: true,
                                 characterData: true});
        timer = setTimeout(() => end("timeout"), ms);
    } catch (e) {
        resolve("unavailable");  // the page replaced what this needs
    }
})"""

# The same wait for an element a plain CSS selector finds (`snapshot.py`):
# one call, without Playwright's selector engine in the page's main world
# (installing it costs each freshly loaded page ~25-40 ms of CPU).
_UNTIL_SHOWN_CHANGES_BY_CSS_JS = (
    "([css, nth, ms, seen]) => ("
    + _UNTIL_SHOWN_CHANGES_JS
    + ")(("
    + PICK_JS
    + ")(css, nth), [ms, seen])"
)

Woke = Literal["changed", "timeout", "gone", "differs", "unavailable", "interrupted"]


async def until_shown_changes(
    ctx: PageContext,
    target: Locator,
    *,
    seen: bool,
    wait_s: float,
    budget: Budget,
    css: tuple[str, int | None] | None = None,
) -> Woke:
    """Until the visibility of `target`'s first match differs from `seen`,
    or `wait_s`: why it woke. "differs": it did already when the wait began;
    "unavailable": the page's script broke the wait (it replaced the
    observer or the timers); "interrupted": the page navigated, or did not
    answer within `PAGE_WAIT_SLACK_S` past the wait's own timer (a renderer
    held by the page's script), or `budget` ran out. Other browser errors
    raise. `css`: the target as plain CSS and its `nth`, on a page known to
    have no shadow root (its last snapshot read it): found in the page."""
    bound = Budget(
        min(budget.deadline, ctx.clock.monotonic() + wait_s + PAGE_WAIT_SLACK_S), budget.label
    )
    try:
        why = await page_step(
            ctx,
            target.page.evaluate(_UNTIL_SHOWN_CHANGES_BY_CSS_JS, [*css, wait_s * 1000, seen])
            if css is not None
            else target.evaluate_all(_UNTIL_SHOWN_CHANGES_JS, [wait_s * 1000, seen]),
            what="waiting for the page to change",
            budget=bound,
        )
    except TransientError as exc:
        if exc.kind == "timeout" or navigated(exc):
            return "interrupted"
        return "unavailable"
    return why if why in ("changed", "timeout", "gone", "differs") else "unavailable"
