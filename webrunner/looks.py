"""What a task reads of a model's page, each read in one call into it.

A task reads its page three ways: the login check (is it logged in, or does
a gate show), the page before the prompt (the previous answer, a done
marker, media already there), and each look while it generates. `PageReads`
compiles a profile's markers into one snapshot for each (`snapshot.py`) and
turns what a snapshot saw into what the driver decides on; a page that must
be read by locators is the driver's own fallback (`page.py`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from playwright.async_api import Locator, Page

from dispatcher.errors import PermanentError
from dispatcher.profiles import WebSpec
from webrunner.gates import GateLook, GateRule
from webrunner.snapshot import MAX_TEXT_CHARS, Probe, Seen, Snapshot, plain_css

# The most media one answer may show: an image model's batch is 1-8. The
# URLs of more would cross into us (a `data:` URL can be megabytes each),
# and each would be a download.
MAX_MEDIA = 64


@dataclass(frozen=True)
class Look:
    """A generating page as one look saw it."""

    error: bool
    logged_out: bool
    busy: bool
    text: str | None  # the latest answer's text
    done: bool  # the `done` marker is visible
    done_text: str | None  # the `done` marker's text
    media: int  # how many media elements the answer has so far
    hold: GateLook


class PageReads:
    """A profile's three reads, compiled once per task."""

    def __init__(self, spec: WebSpec, rule: GateRule) -> None:
        hold = (
            Probe.of(spec.challenge, text=True),
            Probe.of(spec.limit, text=True),
            Probe.of("body" if rule.body_needed else None, text=True),
            Probe.of(rule.banner, text=True),
        )
        self.ready = Snapshot((login_probe(spec), Probe.of(spec.logged_out), *hold))
        self.before = Snapshot(
            (Probe.of(spec.answer, text=True), Probe.of(spec.done), Probe.of(spec.media))
        )
        self.look = Snapshot(
            (
                Probe.of(spec.error),
                Probe.of(spec.logged_out),
                Probe.of(spec.busy),
                Probe.of(spec.answer, text=True),
                Probe.of(spec.done, text=True),
                Probe.of(spec.media),
                *hold,
            )
        )


def hold_of(seen: Sequence[Seen]) -> GateLook:
    challenge, limit, body, banner = seen
    return GateLook(challenge.shown_text, limit.shown_text, body.text, banner.shown_text)


def ready_of(seen: Sequence[Seen]) -> tuple[bool, bool, GateLook]:
    """Logged in or out shown (either marker), the logged-out marker, the gates."""
    return seen[0].visible, seen[1].visible, hold_of(seen[2:])


def before_of(seen: Sequence[Seen]) -> tuple[str | None, bool, int]:
    """The previous answer's text, the done marker shown, the media count."""
    answer, done, media = seen
    return answer.text, done.visible, media.count


def look_of(seen: Sequence[Seen]) -> Look:
    error, logged_out, busy, answer, done, media = seen[:6]
    return Look(
        error.visible,
        logged_out.visible,
        busy.visible,
        answer.text,
        done.visible,
        done.text,
        media.count,
        hold_of(seen[6:]),
    )


def answer_too_long() -> PermanentError:
    """A page's answer past MAX_TEXT_CHARS: not retried, since another
    generation would be paid for and end the same way."""
    return PermanentError(
        f"the page's answer is longer than {MAX_TEXT_CHARS:,} characters "
        "(the most a task reads of a page's text)",
        kind="too_large",
    )


def too_many_media(count: int) -> PermanentError:
    return PermanentError(
        f"the page's answer shows {count} media elements; a task takes {MAX_MEDIA} at most",
        kind="too_large",
    )


def login_markers(page: Page, spec: WebSpec) -> Locator:
    """What a loaded page shows first: the logged-in marker, or the logged-out one."""
    either = page.locator(spec.logged_in)
    if spec.logged_out:
        either = either.or_(page.locator(spec.logged_out))
    return either


def login_probe(spec: WebSpec) -> Probe:
    """`login_markers` as a snapshot's probe."""
    return Probe(tuple(s for s in (spec.logged_in, spec.logged_out) if s))


def acts_directly(spec: WebSpec) -> bool:
    """Whether a task types and sends without Playwright's checking script
    where the page allows it (`actions.py`): plain CSS for the prompt box
    and the send button."""
    return all(plain_css(s) is not None for s in (spec.input, spec.submit) if s)


async def prime(page: Page, spec: WebSpec) -> None:
    """Read a freshly loaded page once, changing nothing, as a task's first
    calls would: Playwright sets its scripts up in each of a document's
    worlds on the first call into it (~25-40 ms of CPU each on the 2-core
    VM; its checking script for clicks and typing, ~60 ms), and a page
    pre-loaded for the next task pays that before the task needs it. The
    task still checks the page itself (`PageDriver.open`).

    A page a snapshot reads needs only its main world set up, if the task
    also types and sends directly; else the world(s) its locators use."""
    markers = Snapshot([login_probe(spec), Probe.of(spec.answer)])
    plain = markers.plain and await markers.read(page) is not None
    if plain and acts_directly(spec):
        return
    await login_markers(page, spec).first.is_visible()
    if not plain:
        await page.locator(spec.answer).evaluate_all("els => els.length")
