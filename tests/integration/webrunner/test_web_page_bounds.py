"""What a task reads of a page's text is bounded (`snapshot.MAX_TEXT_CHARS`):
a page is untrusted, and an answer that never stops growing must neither
cross into us whole on every look nor run until the task's timeout."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from playwright.async_api import Page

from dispatcher.errors import PermanentError
from dispatcher.tasks.artifacts import MAX_HTML_BYTES
from tests.integration.webrunner.localsite import (
    Site,
    page_html,
    site_profile,
    site_task,
    start_runner,
)
from webrunner import evidence
from webrunner.snapshot import MAX_TEXT_CHARS, Probe, Snapshot, first_text, too_long

if TYPE_CHECKING:
    from tests.integration.webrunner.conftest import WebEnv

pytestmark = [pytest.mark.browser, pytest.mark.asyncio(loop_scope="session")]


async def test_a_text_past_the_cap_is_cut_in_the_page_one_character_over(page: Page) -> None:
    await page.set_content(
        "<p id='long'></p><p id='full'></p><script>"
        f"document.getElementById('long').textContent = '  ' + 'x'.repeat({MAX_TEXT_CHARS + 5000});"
        f"document.getElementById('full').textContent = ' ' + 'y'.repeat({MAX_TEXT_CHARS}) + ' ';"
        "</script>"
    )
    seen = await Snapshot([Probe.of("#long", text=True), Probe.of("#full", text=True)]).read(page)
    assert seen is not None
    long_read, full_read = seen[0].text, seen[1].text
    by_locator = await first_text(page.locator("#long"))
    # Leading blanks are trimmed before the cut, so the cut keeps its tell.
    assert long_read == by_locator == "x" * (MAX_TEXT_CHARS + 1)
    assert too_long(long_read)
    # A text of exactly the cap is whole, and not taken for a cut one.
    assert full_read == await first_text(page.locator("#full")) == "y" * MAX_TEXT_CHARS
    assert not too_long(full_read)


# An answer that grows without end while the page shows itself busy.
ENDLESS = """
document.getElementById('go').onclick = () => {
  const out = document.getElementById('out');
  out.innerHTML = '<div id="busy">generating</div><div class="answer"></div>';
  const answer = out.querySelector('.answer');
  const chunk = 'z'.repeat(200000);
  setInterval(() => { answer.textContent += chunk; }, 20);
};
"""


async def test_an_answer_that_never_stops_growing_fails_as_too_large(
    web: WebEnv, site: Site
) -> None:
    site.html["endless"] = page_html(ENDLESS)
    runner = await start_runner(web, site_profile(site, "endless", busy="#busy"))
    task = site_task()
    ctx = web.context(task)[0]
    with pytest.raises(PermanentError) as caught:
        await runner.run(task, ctx)
    # Not a stall nor the profile's timeout: the size, and not worth a retry.
    assert caught.value.kind == "too_large"
    assert f"longer than {MAX_TEXT_CHARS:,} characters" in str(caught.value)


async def test_a_failed_attempt_s_page_html_is_read_cut_in_the_page(page: Page) -> None:
    await page.set_content("<p>small</p>")
    assert await evidence._html(page) == await page.content()
    await page.set_content(
        f"<p id='big'></p><script>big.textContent = 'w'.repeat({3 * 2**20});</script>"
    )
    full = len(await page.content())
    html = await evidence._html(page)
    assert len(html.encode()) <= MAX_HTML_BYTES
    assert html.endswith(f"<!-- cut here: the page's HTML is {full:,} characters -->\n")
