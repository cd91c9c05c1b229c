"""Typing and clicking without Playwright's checking script (`webrunner/actions.py`):
done as Playwright's `fill`, `press` and `click` would do it, on real pages
in Chromium, and refused (the caller then uses the locators, which wait)
whenever Playwright would not act at once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from playwright.async_api import Error as PlaywrightError
from playwright.async_api import Page

from tests.integration.webrunner.localsite import (
    Site,
    page_html,
    site_profile,
    site_task,
    start_runner,
)
from webrunner import actions

if TYPE_CHECKING:
    from tests.integration.webrunner.conftest import WebEnv

pytestmark = [pytest.mark.browser, pytest.mark.asyncio(loop_scope="session")]

# A page that records what its own handlers saw, as a site's framework would.
RECORDER = """
window.seen = [];
for (const el of document.querySelectorAll('textarea, input, [contenteditable]')) {
  el.addEventListener('input', e => seen.push(['input', e.target.id, e.inputType]));
  el.addEventListener('keydown', e => seen.push(['keydown', e.target.id, e.key]));
}
for (const el of document.querySelectorAll('button')) {
  el.addEventListener('click', e => seen.push(['click', e.target.id, e.isTrusted]));
}
"""

FIELDS = """
<textarea id="box">old text</textarea>
<input id="line" value="old line">
<div id="editor" contenteditable="true"><p>old</p><p>paragraphs</p></div>
<textarea id="hidden-box" style="display:none"></textarea>
<textarea id="disabled-box" disabled></textarea>
<input id="readonly-line" readonly value="fixed">
<input id="date" type="date">
<fieldset disabled><input id="in-disabled-fieldset"></fieldset>
<div aria-disabled="true"><textarea id="aria-disabled-box"></textarea></div>
<button id="send">Send</button>
<button id="off" disabled>Off</button>
<div style="position:relative">
  <button id="covered">Covered</button>
  <div style="position:absolute;inset:0;background:white"></div>
</div>
<button id="sliding" style="position:relative;animation:slide 1s linear infinite">Sliding</button>
<style>@keyframes slide { from { left: 0 } to { left: 300px } }</style>
<div style="height:3000px"></div>
<button id="below">Below the fold</button>
"""


async def load(page: Page, body: str = FIELDS) -> None:
    await page.set_content(
        f"<!doctype html><html><body>{body}<script>{RECORDER}</script></body></html>"
    )


async def test_fill_replaces_the_content_as_typed_input(page: Page) -> None:
    await load(page)
    assert await actions.fill(page, "#box", "a red fox\non two lines")
    assert await actions.fill(page, "#line", "one line")
    assert await actions.fill(page, "#editor", "new words")
    assert await page.locator("#box").input_value() == "a red fox\non two lines"
    assert await page.locator("#line").input_value() == "one line"
    assert await page.locator("#editor").inner_text() == "new words"
    # The page's own handlers saw typed input, as with Playwright's `fill`.
    seen = await page.evaluate("seen")
    assert ["input", "box", "insertText"] in seen
    assert ["input", "line", "insertText"] in seen
    assert ["input", "editor", "insertText"] in seen


async def test_fill_with_nothing_empties_the_box(page: Page) -> None:
    await load(page)
    assert await actions.fill(page, "#box", "")
    assert await page.locator("#box").input_value() == ""


async def test_fill_refuses_what_playwright_would_wait_for_or_fill_otherwise(page: Page) -> None:
    await load(page)
    for selector in (
        "#hidden-box",
        "#disabled-box",
        "#readonly-line",
        "#date",
        "#in-disabled-fieldset",
        "#aria-disabled-box",
        "#missing",
        "#send",  # not a text field
        "text=Send",  # Playwright's own syntax
        "#box:has-text('old')",  # refused by the page's CSS parser
    ):
        assert not await actions.fill(page, selector, "nope"), selector
    assert await page.locator("#box").input_value() == "old text"
    assert await page.locator("#readonly-line").input_value() == "fixed"
    assert await page.evaluate("seen") == []


async def test_press_sends_the_key_to_the_box_and_keeps_its_text(page: Page) -> None:
    await load(page)
    assert await actions.fill(page, "#box", "keep me")
    assert await actions.press(page, "#box", "Enter")
    assert ["keydown", "box", "Enter"] in await page.evaluate("seen")
    # The text typed is not selected any more: Enter added a line after it.
    assert await page.locator("#box").input_value() == "keep me\n"
    assert not await actions.press(page, "#disabled-box", "Enter")


async def test_click_clicks_a_shown_button_with_a_trusted_click(page: Page) -> None:
    await load(page)
    assert await actions.click(page, "#send")
    assert await actions.click(page, "#below")  # scrolled into view first
    seen = await page.evaluate("seen")
    assert ["click", "send", True] in seen
    assert ["click", "below", True] in seen


async def test_click_refuses_a_disabled_covered_or_moving_button(page: Page) -> None:
    await load(page)
    for selector in ("#off", "#covered", "#sliding", "#missing", "button:has-text('Send')"):
        assert not await actions.click(page, selector), selector
    assert await page.evaluate("seen") == []


async def test_a_page_that_lies_about_boxes_is_not_clicked(page: Page) -> None:
    await load(page)
    await page.evaluate(
        "Element.prototype.getBoundingClientRect = () =>"
        " ({x: NaN, y: NaN, width: NaN, height: NaN, top: NaN, left: NaN, bottom: NaN, right: NaN})"
    )
    assert not await actions.click(page, "#send")
    assert await page.evaluate("seen") == []


async def test_a_page_with_a_shadow_root_is_left_to_the_locators(page: Page) -> None:
    await load(page, FIELDS + "<div id='host'></div>")
    await page.evaluate("document.getElementById('host').attachShadow({mode: 'open'})")
    assert not await actions.fill(page, "#box", "nope")
    assert not await actions.click(page, "#send")


# The send button shows a moment after the page loads, under a cover that
# goes away later still: the first direct click is refused, and the locator
# click waits for it.
LATE_BUTTON = """
const go = document.getElementById('go');
go.style.visibility = 'hidden';
const cover = document.createElement('div');
cover.style.cssText = 'position:fixed;inset:0;background:white';
setTimeout(() => { go.style.visibility = 'visible'; }, 50);
setTimeout(() => cover.remove(), 400);
document.body.appendChild(cover);
go.onclick = () => {
  const q = document.getElementById('q').value;
  document.getElementById('out').innerHTML =
    '<div class="answer">echo: ' + q + '</div><span id="done">ok</span>';
};
"""


async def test_a_task_whose_send_button_is_covered_at_first_still_sends(
    web: WebEnv, site: Site
) -> None:
    site.html["late"] = page_html(LATE_BUTTON)
    profile = site_profile(site, "late", done="#done")
    runner = await start_runner(web, profile)
    task = site_task("a grey heron")
    result = await runner.run(task, web.context(task)[0])
    assert result.text == "echo: a grey heron"


async def test_a_check_the_page_navigates_under_is_left_to_the_locators(page: Page) -> None:
    await load(page)
    # The page reloads while the check waits: no answer, so the caller acts
    # by the locator on the new page; any other error still raises.
    navigating = "() => { location.reload(); return new Promise(() => {}); }"
    assert await actions._check(page, navigating, []) is None
    # The reload goes on after the check gave up: on a page still being
    # replaced, the next call would meet the navigation too.
    await page.wait_for_function(
        "() => document.readyState === 'complete' && !document.querySelector('#box')"
    )
    with pytest.raises(PlaywrightError, match="broken page"):
        await actions._check(page, "() => { throw new Error('broken page'); }", [])
