"""A snapshot (`webrunner/snapshot.py`) reads a page as Playwright's locators
would, in one call, or says it cannot; and a task on a page it cannot read
still finishes, read by locators.

The oracle is Playwright itself: every selector below is read both ways on
the same real page in Chromium, and the answers must agree.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from playwright.async_api import Page

from tests.integration.webrunner.localsite import (
    Site,
    page_html,
    site_profile,
    site_task,
    start_runner,
)
from webrunner.snapshot import Probe, Seen, Snapshot

if TYPE_CHECKING:
    from tests.integration.webrunner.conftest import WebEnv

pytestmark = [pytest.mark.browser, pytest.mark.asyncio(loop_scope="session")]

# Every way an element can be there and not be seen, as real pages do it.
MARKERS = """
<div class="msg">one</div>
<div class="msg" style="display:none">two, not displayed</div>
<div class="msg">three <b>bold</b></div>
<div id="invisible" style="visibility:hidden">hidden by visibility</div>
<div id="collapsed" style="visibility:collapse">collapsed</div>
<div id="zero" style="width:0;height:0;overflow:hidden">no box</div>
<div id="faded" style="opacity:0">transparent, still visible to Playwright</div>
<div id="contents" style="display:contents"><span>a child shows</span></div>
<div id="contents-empty" style="display:contents"></div>
<div id="contents-text" style="display:contents">bare text shows</div>
<div style="display:none"><p id="inside-hidden">in a hidden parent</p></div>
<details><summary>more</summary><p id="in-closed-details">folded</p></details>
<div id="off-screen" style="position:absolute;left:-9999px">off screen</div>
<input id="field" value="typed">
<ul><li class="item">1</li><li class="item">2</li><li class="item">3</li></ul>
<form id="login-form" style="display:none">sign in</form>
<div id="composer">write here</div>
"""

SELECTORS = (
    ".msg",
    ".msg >> nth=0",
    ".msg >> nth=1",
    ".msg >> nth=-1",
    ".msg >> nth=-3",
    ".msg >> nth=9",
    "#invisible",
    "#collapsed",
    "#zero",
    "#faded",
    "#contents",
    "#contents-empty",
    "#contents-text",
    "#inside-hidden",
    "#in-closed-details",
    "#off-screen",
    "#field",
    "li.item:nth-child(2)",
    "ul > .item >> nth=-1",
    "#missing",
    "body",
)


async def by_locators(page: Page, selectors: tuple[str, ...], text: bool) -> Seen:
    """What the driver's locator calls answer for one probe."""
    either = page.locator(selectors[0])
    for other in selectors[1:]:
        either = either.or_(page.locator(other))
    texts = await either.evaluate_all("els => els.map(e => e.innerText)") if text else []
    return Seen(
        await either.count(),
        await either.first.is_visible(),
        str(texts[0]).strip() if texts else None,
    )


async def test_each_selector_reads_as_playwright_reads_it(page: Page) -> None:
    await page.set_content(f"<!doctype html><html><body>{MARKERS}</body></html>")
    probes = [Probe((s,), text=True) for s in SELECTORS]
    # Either of two markers, first in the document's order, whichever is listed first.
    probes += [Probe(("#composer", "#login-form")), Probe(("#login-form", "#composer"))]
    probes += [Probe((".item >> nth=-1", ".msg >> nth=-1"), text=True)]
    snapshot = Snapshot(probes)
    assert snapshot.plain
    seen = await snapshot.read(page)
    assert seen is not None
    expected = [await by_locators(page, p.selectors, p.text) for p in probes]
    assert dict(zip(probes, seen, strict=True)) == dict(zip(probes, expected, strict=True))
    # The page is not one where everything is visible or everything hidden.
    assert {s.visible for s in seen} == {True, False}
    assert seen[SELECTORS.index(".msg >> nth=-1")].text == "three bold"


async def test_a_selector_with_no_probe_reads_as_nothing(page: Page) -> None:
    await page.set_content("<p>x</p>")
    seen = await Snapshot([Probe.of(None, text=True), Probe.of("p")]).read(page)
    assert seen == [Seen(0, False, None), Seen(1, True, None)]


async def test_a_shadow_root_or_playwright_s_own_syntax_is_left_to_the_locators(
    page: Page,
) -> None:
    await page.set_content(
        "<div id='host'></div><p class='answer'>light</p><script>"
        "document.getElementById('host').attachShadow({mode: 'open'}).innerHTML ="
        " '<p class=\"answer\">inside the shadow</p>';</script>"
    )
    # Playwright's CSS finds the answer in the shadow root too: a snapshot
    # would count one, so it answers nothing.
    assert await page.locator(".answer").all_inner_texts() == ["light", "inside the shadow"]
    assert await Snapshot([Probe.of(".answer", text=True)]).read(page) is None

    await page.set_content("<p class='answer'>light</p>")
    assert await Snapshot([Probe.of(".answer", text=True)]).read(page) is not None
    # Playwright's own pseudo-class: the page's CSS parser refuses it.
    assert await Snapshot([Probe.of(".answer:has-text('light')")]).read(page) is None
    # Named engines and other steps are known not to be CSS before any call.
    for selector in ("text=light", "xpath=//p", "//p", "'light'", ".answer >> visible=true"):
        assert not Snapshot([Probe.of(selector)]).plain, selector


SHADOW_ANSWER = """
customElements.define('x-answer', class extends HTMLElement {
  connectedCallback() {
    this.attachShadow({mode: 'open'}).innerHTML =
      '<div class="answer">' + this.getAttribute('text') + '</div><span id="done">ok</span>';
  }
});
document.getElementById('go').onclick = () => {
  const q = document.getElementById('q').value;
  const out = document.getElementById('out');
  out.innerHTML = '<div id="busy">generating</div>';
  setTimeout(() => {
    out.innerHTML = '';
    const answer = document.createElement('x-answer');
    answer.setAttribute('text', 'echo: ' + q);
    out.appendChild(answer);
  }, 300);
};
"""

TEXT_BUSY = """
document.getElementById('go').onclick = () => {
  const q = document.getElementById('q').value;
  const out = document.getElementById('out');
  out.innerHTML = '<div class="note">still thinking</div>';
  setTimeout(() => {
    out.innerHTML = '<div class="answer">echo: ' + q + '</div><span id="done">ok</span>';
  }, 300);
};
"""


async def test_a_task_on_a_page_with_its_answer_in_a_shadow_root_finishes(
    web: WebEnv, site: Site
) -> None:
    # A web component's answer: only Playwright's CSS reaches it.
    site.html["shadow"] = page_html(SHADOW_ANSWER)
    profile = site_profile(site, "shadow", busy="#busy", done="#done")
    runner = await start_runner(web, profile)
    task = site_task("a blue whale")
    result = await runner.run(task, web.context(task)[0])
    assert result.text == "echo: a blue whale"


async def test_a_task_whose_profile_uses_playwright_s_own_selectors_finishes(
    web: WebEnv, site: Site
) -> None:
    site.html["text-busy"] = page_html(TEXT_BUSY)
    profile = site_profile(
        site, "text-busy", busy="text=still thinking", done="#out #done:has-text('ok')"
    )
    runner = await start_runner(web, profile)
    task = site_task("a red kite")
    result = await runner.run(task, web.context(task)[0])
    assert result.text == "echo: a red kite"
