"""Typing the prompt and clicking send in a few plain calls.

Playwright's `fill`, `click` and `press` run its actionability checks in a
separate world of the page, and its checking script (~345 KB) is sent into
each new document's world on first use: a web task loads its page fresh,
so every task paid for it. Measured on the 2-core VM (2026-12-04): loading
a small page and filling a box and clicking its button cost ~180 ms of CPU
(browser, renderer, driver) against ~95 ms for the load alone; done with
one `page.evaluate` and DevTools' own input events, ~110 ms.

So where the page allows it (`snapshot.py`'s rule: a plain CSS selector, no
open shadow root) one call into the page checks the element as Playwright
would before acting (visible, enabled, editable, not covered, not moving),
focuses it, and answers where to click; then the keystrokes and the mouse
events go as DevTools input events, the same ones Playwright sends. When
the check fails (not shown yet, disabled, covered, moving, a selector only
Playwright's engine reads, the page navigating under it) the call answers
None, and the caller acts by Playwright's locators, which wait and report as
before. Once the keys or the click have gone, nothing is tried again.
"""

from __future__ import annotations

import math
from typing import Any

from playwright.async_api import Error as PlaywrightError
from playwright.async_api import Page

from webrunner.pagestep import navigation_error
from webrunner.snapshot import HAS_SHADOW_JS, PICK_JS, VISIBLE_JS, plain_css

# The element the selector picks first, if the page may be acted on
# directly, it is shown, and it is not disabled (natively, in a disabled
# fieldset, or by `aria-disabled` on it or an ancestor).
_TARGET_JS = (
    """(css, nth) => {
  const pick = """
    + PICK_JS
    + """;
  const visible = """
    + VISIBLE_JS
    + """;
  if (("""
    + HAS_SHADOW_JS
    + """)()) return null;
  let el;
  try {
    el = pick(css, nth)[0];
  } catch (e) {
    return null;
  }
  if (!el || !visible(el)) return null;
  if (el.matches(':disabled') || el.closest('[aria-disabled="true"]')) return null;
  return el;
}"""
)

# Text-like inputs only: Playwright sets a date's or a colour's value
# another way, and the fallback does that.
_FOCUS_JS = (
    """([css, nth, select]) => {
  const target = """
    + _TARGET_JS
    + """;
  const el = target(css, nth);
  if (!el) return false;
  const textTypes = ['', 'text', 'search', 'url', 'tel', 'email', 'password'];
  if (el.tagName === 'INPUT') {
    if (!textTypes.includes(el.type) || el.readOnly) return false;
  } else if (el.tagName === 'TEXTAREA') {
    if (el.readOnly) return false;
  } else if (!el.isContentEditable || el.closest('[aria-readonly="true"]')) {
    return false;
  }
  el.focus();
  if (document.activeElement !== el) return false;
  if (!select) return true;
  if (el.tagName === 'INPUT' || el.tagName === 'TEXTAREA') {
    el.select();
  } else {
    const range = document.createRange();
    range.selectNodeContents(el);
    const selection = window.getSelection();
    selection.removeAllRanges();
    selection.addRange(range);
  }
  return true;
}"""
)

# Where to click: the centre of the element's box, scrolled into view, if
# the box has not moved from one frame to the next and the element (or a
# child of it) is what is at that point. An animation moves a box only as
# frames are painted, so both looks are taken in a frame's callback: a look
# before the first frame could share its animation time, and under a load
# that starves the renderer a moving button read as still. With no frame
# within 500 ms (a tab that paints no frames), the click is left to the
# locator (null), which has its own wait.
_CLICK_POINT_JS = (
    """async ([css, nth]) => {
  const target = """
    + _TARGET_JS
    + """;
  const el = target(css, nth);
  if (!el) return null;
  const inView = r => r.top >= 0 && r.left >= 0 && r.bottom <= innerHeight && r.right <= innerWidth;
  if (!inView(el.getBoundingClientRect())) {
    el.scrollIntoView({block: 'center', inline: 'center', behavior: 'instant'});
  }
  const painted = () => new Promise(done => {
    requestAnimationFrame(() => done(true)); setTimeout(() => done(false), 500);
  });
  if (!(await painted())) return null;
  const before = el.getBoundingClientRect();
  if (!(await painted())) return null;
  const box = el.getBoundingClientRect();
  if (box.x !== before.x || box.y !== before.y || box.width !== before.width
      || box.height !== before.height) return null;
  const x = box.left + box.width / 2;
  const y = box.top + box.height / 2;
  if (x < 0 || y < 0 || x >= innerWidth || y >= innerHeight) return null;
  const hit = document.elementFromPoint(x, y);
  if (!hit || !(hit === el || el.contains(hit))) return null;
  return [x, y];
}"""
)


async def _check(page: Page, js: str, arg: list[Any]) -> Any:
    """The page's answer to a check before acting; None when the page
    navigated under it (the locator then waits for the new page). Only the
    check is given up this way: once keys or a click have gone, an error is
    the caller's, never a second try that could send the prompt twice."""
    try:
        return await page.evaluate(js, arg)
    except PlaywrightError as exc:
        if navigation_error(str(exc)):
            return None
        raise


async def focus(page: Page, selector: str, *, select: bool) -> bool:
    """Focus the selector's first element if it takes typed text (and select
    its content, as `fill` does); False: act by locators instead."""
    picked = plain_css(selector)
    if picked is None:
        return False
    return await _check(page, _FOCUS_JS, [*picked, select]) is True


async def fill(page: Page, selector: str, text: str) -> bool:
    """Replace the element's content with `text`, typed as one input event
    (DevTools' `insertText`, as Playwright's `fill`); False: not done."""
    if not await focus(page, selector, select=True):
        return False
    if text:
        await page.keyboard.insert_text(text)
    else:
        await page.keyboard.press("Delete")
    return True


async def press(page: Page, selector: str, key: str) -> bool:
    """Focus the element and press `key` on it; False: not done."""
    if not await focus(page, selector, select=False):
        return False
    await page.keyboard.press(key)
    return True


async def click(page: Page, selector: str) -> bool:
    """Click the centre of the element with DevTools' mouse events; False:
    it is not ready to be clicked (or the page must be read by locators)."""
    picked = plain_css(selector)
    if picked is None:
        return False
    point = await _check(page, _CLICK_POINT_JS, [*picked])
    # The page's answer is checked for shape: its builtins may be replaced.
    if not (
        isinstance(point, list)
        and len(point) == 2
        and all(
            isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
            for v in point
        )
    ):
        return False
    await page.mouse.click(float(point[0]), float(point[1]))
    return True
