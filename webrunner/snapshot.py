"""Many markers of a page read in one call into it: a snapshot.

Each Playwright locator call is a few DevTools commands, every one relayed
by the browser process into the page and back through the Playwright
driver. A look at a generating page (busy, answer, done, error, logout,
media, gates) made fourteen of them: ~17 ms of CPU in Chromium, the driver
and us, against ~1.3 ms for one `page.evaluate` reading the same markers
(2-core VM, 2026-12-04). With twenty accounts on two cores, that CPU is
what bounds the makespan (BENCHMARKS.md, finding 11).

Only what native CSS answers exactly as Playwright would is read this way:
a CSS selector, with at most a last ` >> nth=N`, on a page without open
shadow roots (Playwright's CSS pierces them, `querySelectorAll` does not).
A selector in Playwright's own syntax (`text=`, xpath, `:has-text()`, any
other `>>` step) or a shadow root on the page makes `read` answer None, and
the caller reads by locators instead. Visibility is Playwright's rule: a
non-empty box, `checkVisibility()`, `visibility: visible`, and for a
`display: contents` element a visible child element or text.

A page is untrusted and its text may be any size: every text read, by a
snapshot or by a locator (`first_text`), is cut in the page to
`MAX_TEXT_CHARS` and one character more, which tells the reader that the
element held more (`too_long`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from playwright.async_api import Locator, Page

# The most of one element's text a read brings out of the page. An answer
# that long is ~250,000 tokens, beyond any chat model's; a page showing more
# is broken or hostile, and its text would cross DevTools, the driver and
# us on every look.
MAX_TEXT_CHARS = 1_000_000

_NTH_STEP = re.compile(r"^\s*nth\s*=\s*(-?\d+)\s*$")
# `text=...`, `xpath=...`, `role=...`, `css=...`: an engine Playwright picks by name.
_ENGINE_PREFIX = re.compile(r"^\s*[A-Za-z_][\w-]*\s*=")


def plain_css(selector: str) -> tuple[str, int | None] | None:
    """The CSS and the `nth` of a selector native CSS can answer, else None.

    Playwright reads a leading `//` or `..` as xpath and a quote as text; a
    pseudo-class of its own (`:has-text()`, `:visible`) passes here and is
    refused by the page's `querySelectorAll`, which `read` turns into None.
    """
    css, *steps = selector.split(">>")
    css = css.strip()
    if not css or _ENGINE_PREFIX.match(css) or css.startswith(("/", "..", '"', "'")):
        return None
    if not steps:
        return css, None
    if len(steps) == 1 and (nth := _NTH_STEP.match(steps[0])):
        return css, int(nth.group(1))
    return None


@dataclass(frozen=True)
class Probe:
    """One thing to read: the first element (in document order) that any
    of `selectors` matches; whether it is visible, how many match, and its
    text when `text` is asked. No selector: nothing matches."""

    selectors: tuple[str, ...]
    text: bool = False

    @classmethod
    def of(cls, selector: str | None, *, text: bool = False) -> Probe:
        return cls((selector,) if selector else (), text)


@dataclass(frozen=True)
class Seen:
    """What a probe found."""

    count: int
    visible: bool
    # The first match's innerText, stripped, cut after MAX_TEXT_CHARS + 1;
    # None: no match or not asked.
    text: str | None

    @property
    def shown_text(self) -> str | None:
        """The text of a visible match; '' for one without text; None when hidden."""
        return (self.text or "") if self.visible else None


NOTHING = Seen(0, False, None)


class Snapshot:
    """Probes compiled once (per task), read together by `read`."""

    def __init__(self, probes: Sequence[Probe]) -> None:
        self.probes = tuple(probes)
        compiled: list[list[Any]] = []
        plain = True
        for probe in self.probes:
            selectors = [plain_css(s) for s in probe.selectors]
            if any(s is None for s in selectors):
                plain = False
            compiled.append([[list(s) for s in selectors if s is not None], probe.text])
        # False: one of the selectors needs Playwright's engine on every page.
        self.plain = plain
        self._arg = compiled

    async def read(self, page: Page) -> list[Seen] | None:
        """One call into the page; None when it must be read by locators."""
        raw = await page.evaluate(_READ_JS, [self._arg, MAX_TEXT_CHARS])
        # The answer comes from a page we do not trust to leave the
        # builtins alone: anything but the expected shape falls back.
        if not isinstance(raw, list) or len(raw) != len(self.probes):
            return None
        seen: list[Seen] = []
        for item in raw:
            if not (isinstance(item, list) and len(item) == 3):
                return None
            count, visible, text = item
            if not isinstance(count, int) or not isinstance(visible, bool):
                return None
            seen.append(Seen(count, visible, None if text is None else _stripped(text)))
        return seen


def too_long(text: str | None) -> bool:
    """Whether a text read from the page was cut: the element held more than
    MAX_TEXT_CHARS characters."""
    return text is not None and len(text) > MAX_TEXT_CHARS


# The first element's innerText, cut in the page (a locator's `evaluate_all`).
_FIRST_TEXT_JS = """(els, maxChars) =>
  els.length ? [String(els[0].innerText ?? '').trim().slice(0, maxChars + 1)] : []"""


def _stripped(text: object) -> str:
    # Trimmed in the page before the cut: a cut text keeps its last
    # character, which tells it was cut.
    cut = str(text)
    return cut if len(cut) > MAX_TEXT_CHARS else cut.strip()


async def first_text(locator: Locator) -> str | None:
    """The inner text of the locator's first match, stripped and cut as a
    snapshot's are; None when nothing matches."""
    texts = await locator.evaluate_all(_FIRST_TEXT_JS, MAX_TEXT_CHARS)
    return _stripped(texts[0]) if texts else None


# The elements a plain CSS selector and its `nth` pick, in document order;
# throws on a selector the page's CSS parser refuses. Also the busy wait's
# (`pagewait.py`).
PICK_JS = """(css, nth) => {
  const els = Array.from(document.querySelectorAll(css));
  if (nth === null) return els;
  const at = nth < 0 ? els.length + nth : nth;
  return at >= 0 && at < els.length ? [els[at]] : [];
}"""

# Whether the page has an open shadow root, which `querySelectorAll` does not
# enter and Playwright's CSS does. Also the actions' (`actions.py`).
HAS_SHADOW_JS = """() => {
  const everything = document.querySelectorAll('*');
  for (let i = 0; i < everything.length; i++) {
    if (everything[i].shadowRoot) return true;
  }
  return false;
}"""

# Whether an element is visible by Playwright's rule. Also the actions'
# (`actions.py`).
VISIBLE_JS = """(() => {
  const hasBox = r => r.width > 0 && r.height > 0;
  const visible = el => {
    const style = getComputedStyle(el);
    if (style.display === 'contents') {
      for (let child = el.firstChild; child; child = child.nextSibling) {
        if (child.nodeType === 1 && visible(child)) return true;
        if (child.nodeType === 3) {
          const range = document.createRange();
          range.selectNode(child);
          if (hasBox(range.getBoundingClientRect())) return true;
        }
      }
      return false;
    }
    if (!el.checkVisibility() || style.visibility !== 'visible') return false;
    return hasBox(el.getBoundingClientRect());
  };
  return visible;
})()"""

# Returns null (read by locators instead) for a page with an open shadow
# root or a selector its CSS parser refuses.
_READ_JS = (
    """([probes, maxChars]) => {
  const pick = """
    + PICK_JS
    + """;
  if (("""
    + HAS_SHADOW_JS
    + """)()) return null;
  const visible = """
    + VISIBLE_JS
    + """;
  const out = [];
  for (const [selectors, wantText] of probes) {
    let found = [];
    for (const [css, nth] of selectors) {
      try {
        found = found.concat(pick(css, nth));
      } catch (e) {
        return null;
      }
    }
    if (selectors.length > 1) {
      found = Array.from(new Set(found)).sort((a, b) =>
        a === b ? 0 : a.compareDocumentPosition(b) & Node.DOCUMENT_POSITION_FOLLOWING ? -1 : 1);
    }
    const first = found[0];
    const text = first && wantText
      ? String(first.innerText ?? '').trim().slice(0, maxChars + 1) : null;
    out.push([found.length, first ? visible(first) : false, text]);
  }
  return out;
}"""
)
