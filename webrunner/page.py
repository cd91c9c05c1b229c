"""Drive a model's chat page using nothing but its profile's [web] selectors.

Every call into the page goes through `page_step` (`pagestep.py`), i.e. the
run's one guard: a cancel ends it at once, the phase's deadline bounds it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar
from urllib.parse import urljoin

from playwright.async_api import Error as PlaywrightError
from playwright.async_api import FilePayload, Locator, Page

from dispatcher.errors import AccountHold, AuthError, RunError, TransientError
from dispatcher.profiles import WebSpec
from dispatcher.refimages import Prepared
from webrunner import actions, looks
from webrunner.gates import GateLook, GateRule, logged_out_error
from webrunner.looks import Look, PageReads, before_of, login_markers, look_of, ready_of
from webrunner.pagestep import Budget, PageContext, navigated, page_step
from webrunner.pagewait import MAX_BUSY_LOOK_S, until_shown_changes
from webrunner.snapshot import Seen, Snapshot, first_text, plain_css, too_long

T = TypeVar("T")


# Real seconds between two looks at a generating page: short enough to see a
# `stable_ms` of a scaled-down test, cheap enough for a 10-minute generation.
MAX_POLL_S = 0.2
MIN_POLL_S = 0.02
# Real seconds a page gets to show either its logged-in or logged-out marker.
PAGE_READY_S = 60.0
# The share of the page's budget a load begun at the browser's launch is
# waited for; the caller loads the page itself with the rest. Playwright
# learns of that load from what the browser tells it while it connects, and
# can miss its end (browser-use/browser-use#682 loads again for the same
# reason): with twenty browsers starting on two cores, one start waited its
# whole minute for it and failed.
LAUNCH_LOAD_SHARE = 1 / 3
STOP_CLICK_S = 2.0
# Real seconds a failed attempt's page gets to load again and show whether
# the account is still logged in (`logged_out_on_reload`).
LOGIN_LOOK_S = 20.0
# Real seconds between two looks at a loading page for a gate that only a
# regex over its text can spot (any marker with a selector wakes it at once).
GATE_POLL_S = 0.25

_MEDIA_SOURCES_JS = """(els, most) => els.slice(0, most + 1).map(e =>
    e.currentSrc || e.src || (e.querySelector && e.querySelector('source[src]')
        ? e.querySelector('source[src]').src : '') || e.getAttribute('src') || '')"""


def compose_message(spec: WebSpec, prompt: str) -> str:
    """What is typed into the page: instructions first, unless the model wants none."""
    if spec.need_empty_prompt or not spec.instructions.strip():
        return prompt
    return f"{spec.instructions}\n\n{prompt}"


async def started_on(
    ctx: PageContext, page: Page, start_url: str, spec: WebSpec, budget: Budget
) -> bool:
    """Whether a just-launched browser's first tab (told to open `start_url`)
    has loaded the model's page: it loads while Playwright connects. If it
    has not (an error page, a redirect elsewhere), the caller loads it."""
    if start_url != spec.url:
        return False
    try:
        await page_step(
            ctx,
            page.wait_for_load_state(
                "domcontentloaded",
                timeout=budget.remaining(ctx.clock) * LAUNCH_LOAD_SHARE * 1000,
            ),
            what=f"loading {spec.url}",
            budget=budget,
        )
    except TransientError:
        return False
    return page.url == spec.url


# A page that keeps navigating while we wait is broken, not signed out.
MAX_PAGE_NAVIGATIONS = 3


class PageDriver:
    """One task's conversation with one page."""

    def __init__(self, page: Page, spec: WebSpec, ctx: PageContext, *, budget: Budget) -> None:
        self.page = page
        self.spec = spec
        self.ctx = ctx
        # The runner gives each phase (page load, generation, downloads) its own.
        self.budget = budget
        self.submitted = False
        # Media elements on the page when the answer was seen finished.
        self.finished_media: int | None = None
        # What the page showed before the prompt was sent: a `done` marker
        # showing then belongs to an earlier answer, and media already there
        # are no answer to this prompt.
        self._done_before = False
        self._media_before = 0
        stable_real = ctx.clock.scaled(spec.stable_ms / 1000)
        self.stable_s = stable_real
        self.poll_s = min(MAX_POLL_S, max(MIN_POLL_S, stable_real / 4))
        self.stall_s = ctx.clock.scaled(spec.stall_s)
        # Looks at a busy page: often enough to see a stall within a quarter
        # of `stall_s`, never less often than `poll_s`.
        self.busy_look_s = max(self.poll_s, min(MAX_BUSY_LOOK_S, self.stall_s / 4))
        # The last wait in the page woke at once: the marker had changed
        # between the look and the wait (`_until_busy_changes`).
        self._wait_differed = False
        self._gates_rule = GateRule.of(spec)
        # Whether snapshots read this page (`snapshot.py`): None until one
        # tries; True once one did (no shadow root then); False once one was
        # refused, and the rest of the task reads by locators.
        self._plain_page: bool | None = None
        self._reads = PageReads(spec, self._gates_rule)

    # -- small helpers ---------------------------------------------------

    async def call(self, aw: Awaitable[T], what: str) -> T:
        """One page call through the run's guard, within the phase's budget."""
        return await page_step(self.ctx, aw, what=what, budget=self.budget)

    _call = call

    def remaining_ms(self, cap_s: float) -> float:
        """Milliseconds for a Playwright call: `cap_s`, or what the budget has left."""
        left = self.budget.remaining(self.ctx.clock)
        return max(1.0, min(cap_s, left) * 1000)

    _remaining_ms = remaining_ms

    def _loc(self, selector: str) -> Locator:
        return self.page.locator(selector)

    async def _visible(self, selector: str | None, what: str) -> bool:
        if not selector:
            return False
        return await self._call(self._loc(selector).first.is_visible(), what)

    async def _text(self, selector: str | None, what: str) -> str | None:
        """The inner text of the first match, None when nothing matches (or no selector)."""
        if not selector:
            return None
        return await self._call(first_text(self._loc(selector)), what)

    async def _read(self, snapshot: Snapshot, what: str) -> list[Seen] | None:
        """The snapshot's probes in one call, or None: read them by locators."""
        if not snapshot.plain or self._plain_page is False:
            return None
        seen = await self._call(snapshot.read(self.page), what)
        self._plain_page = seen is not None
        return seen

    def _logged_out_error(self) -> AuthError:
        return logged_out_error(self.spec, self.ctx.owner)

    # -- the steps ---------------------------------------------------------

    async def open(self, *, load: bool = True) -> None:
        """Load the model's page (unless it was just loaded) and check the login."""
        spec = self.spec
        try:
            if load:
                await self._call(
                    self.page.goto(
                        spec.url,
                        wait_until="domcontentloaded",
                        timeout=self._remaining_ms(PAGE_READY_S),
                    ),
                    f"loading {spec.url}",
                )
        except TransientError as exc:
            raise TransientError(str(exc), kind="page_load") from exc
        await self._wait_ready(login_markers(self.page, spec))

    async def logged_out_on_reload(self) -> RunError | None:
        """Load the page again and look: the logout (or another hold on the
        account) it shows now, else None. A session revoked while the page
        was loaded (the site restarted, the user signed out elsewhere) often
        shows as a bare error, and the login form only on the next load."""
        self.budget = Budget.after(self.ctx.clock, LOGIN_LOOK_S, f"{LOGIN_LOOK_S:.0f} s")
        try:
            await self.open()
        except (AuthError, AccountHold) as held:
            return held
        except RunError:
            return None  # no verdict either way: the attempt's own error stands
        return None

    def _gates(self, either: Locator) -> Locator:
        """Whatever a loading page may show first: a login marker, or a gate
        (a human check, a usage cap) that replaces the whole page."""
        gates = either
        for selector in (self.spec.challenge, self.spec.limit):
            if selector:
                gates = gates.or_(self._loc(selector))
        return gates

    async def _wait_ready(self, either: Locator) -> None:
        """Until the page shows that it is logged in; a gate (logged out, a
        human check, a usage cap, a `logged_out_text`) raises as soon as it
        shows, whether or not a login marker is on the page.

        A page loaded (and read) ahead for this task, in a spare tab or at
        the browser's start, shows its markers already: the first look reads
        the login and the account markers together, one round trip. A page
        that shows none yet (still rendering, or navigating) is waited for,
        woken by any marker; a gate only a regex can spot (`limit_text`,
        `logged_out_text` over the page's text) is read again each
        `GATE_POLL_S`.
        """
        clock = self.ctx.clock
        gates = self._gates(either)
        navigations = 0
        while True:
            try:
                shown, logged_out, hold = await self._ready_look(either)
            except TransientError as exc:
                if exc.kind == "timeout":
                    raise self._not_ready() from exc
                if not navigated(exc) or navigations >= MAX_PAGE_NAVIGATIONS:
                    raise
                navigations += 1
                shown = False
            else:
                if logged_out:
                    raise self._logged_out_error()
                await self._raise_hold(hold)
                if shown:
                    return
            if self.budget.remaining(clock) <= 0:
                raise self._not_ready()
            try:
                await self._call(
                    gates.first.wait_for(state="visible", timeout=self._remaining_ms(GATE_POLL_S)),
                    "waiting for the page to show that it is logged in",
                )
            except TransientError as exc:
                # Nothing showed yet (or the page navigated): look again.
                if exc.kind != "timeout" and not navigated(exc):
                    raise

    async def _ready_look(self, either: Locator) -> tuple[bool, bool, GateLook]:
        seen = await self._read(self._reads.ready, "checking that it is logged in")
        if seen is not None:
            return ready_of(seen)
        return await asyncio.gather(
            self._call(either.first.is_visible(), "checking that it is logged in"),
            self._visible(self.spec.logged_out, "checking for the logged-out marker"),
            self._hold_look(),
        )

    def _not_ready(self) -> TransientError:
        spec = self.spec
        return TransientError(
            f"{spec.url} showed neither {spec.logged_in!r} nor {spec.logged_out!r} "
            f"(timed out after {self.budget.label})",
            kind="page_load",
        )

    async def _hold_look(self) -> GateLook:
        """What the gates' verdict needs from the page, read in one round trip."""
        spec, rule = self.spec, self._gates_rule
        banner = rule.banner
        (
            (challenge, challenge_text, limit, limit_text),
            (body, banner_shown, said),
        ) = await asyncio.gather(
            asyncio.gather(
                self._visible(spec.challenge, "checking for a human check"),
                self._text(spec.challenge, "reading the human check"),
                self._visible(spec.limit, "checking for a usage cap"),
                self._text(spec.limit, "reading the usage cap"),
            ),
            asyncio.gather(
                self._text("body" if rule.body_needed else None, "reading the page"),
                self._visible(banner, "checking for an error banner"),
                self._text(banner, "reading the error banner"),
            ),
        )
        return GateLook(
            (challenge_text or "") if challenge else None,
            (limit_text or "") if limit else None,
            body,
            said if banner_shown else None,
        )

    async def _before_look(self) -> tuple[str | None, bool, int]:
        """The answer's text, the done marker and the media before the prompt."""
        seen = await self._read(self._reads.before, "reading the page before the prompt")
        if seen is not None:
            return before_of(seen)
        return await asyncio.gather(
            self._text(self.spec.answer, "reading the previous answer"),
            self._visible(self.spec.done, "checking the done marker"),
            self._media_count(),
        )

    async def _raise_hold(self, look: GateLook) -> None:
        """A human check, a usage cap or a logout on the page: the account, not the task."""
        error = self._gates_rule.verdict(look, self.ctx.owner, self.ctx.clock.now())
        if error is not None:
            raise error

    async def _look(self) -> Look:
        """All the markers of a generating page at once: the calls travel
        together to the browser, so a look costs one round trip, not eight."""
        spec = self.spec
        seen = await self._read(self._reads.look, "looking at the page")
        if seen is not None:
            return look_of(seen)
        (error, logged_out, busy, text, done, done_text), media, hold = await asyncio.gather(
            asyncio.gather(
                self._visible(spec.error, "checking for an error banner"),
                self._visible(spec.logged_out, "checking for the logged-out marker"),
                self._visible(spec.busy, "checking whether it is generating"),
                self._text(spec.answer, "reading the answer"),
                self._visible(spec.done, "checking the done marker"),
                self._text(spec.done, "reading the done marker"),
            ),
            self._media_count(),
            self._hold_look(),
        )
        return Look(error, logged_out, busy, text, done, done_text, media, hold)

    async def _media_count(self) -> int:
        """How many media elements the answer has: a look counts them, and
        only the finished answer's sources are read (a `data:` URL can be
        megabytes, too much to ship on every look)."""
        if not self.spec.media:
            return 0
        return await self._call(self._loc(self.spec.media).count(), "counting media results")

    async def _media_list(self) -> list[str]:
        """The media elements' sources as the page has them (empty for none yet)."""
        if not self.spec.media:
            return []
        sources = await self._call(
            self._loc(self.spec.media).evaluate_all(_MEDIA_SOURCES_JS, looks.MAX_MEDIA),
            "listing media results",
        )
        return [str(src) for src in sources]

    async def submit(self, message: str, images: Sequence[Prepared] = ()) -> str | None:
        """Attach the images, type the message and send it; return the answer
        text that was there before."""
        spec = self.spec
        if images:
            await self.attach(images)
        box = self._loc(spec.input).first
        # Independent calls: sent together, they cost one round trip.
        (before, self._done_before, self._media_before), _ = await asyncio.gather(
            self._before_look(),
            self._act(
                lambda: actions.fill(self.page, spec.input, message),
                lambda: box.fill(message, timeout=self._remaining_ms(30)),
                "typing the prompt",
            ),
        )
        self.ctx.check_canceled()
        if spec.submit:
            submit = spec.submit
            await self._act(
                lambda: actions.click(self.page, submit),
                lambda: self._loc(submit).first.click(timeout=self._remaining_ms(30)),
                "clicking submit",
            )
        else:
            key = spec.submit_key
            assert key is not None  # the profile validator guarantees one
            await self._act(
                lambda: actions.press(self.page, spec.input, key),
                lambda: box.press(key, timeout=self._remaining_ms(30)),
                "pressing submit",
            )
        self.submitted = True
        return before

    async def _act(
        self,
        direct: Callable[[], Awaitable[bool]],
        by_locator: Callable[[], Awaitable[None]],
        what: str,
    ) -> None:
        """Act on the page directly (`actions.py`) where it allows that now,
        else by Playwright's locator, which waits for the element (also on
        the page a navigation during the direct check brings)."""
        if self._plain_page is not False and await self._call(direct(), what):
            return
        await self._call(by_locator(), what)

    async def attach(self, images: Sequence[Prepared]) -> None:
        """Give the page the images as picked files, then wait until it shows
        them ready (``upload_done``)."""
        spec = self.spec
        assert spec.upload is not None  # `load_references` refuses images without it
        payloads: list[FilePayload] = [
            {"name": image.filename, "mimeType": image.mime, "buffer": image.data}
            for image in images
        ]
        target = self._loc(spec.upload).first
        is_input = await self._call(
            target.evaluate("e => e.tagName === 'INPUT' && e.type === 'file'"),
            "finding the file input",
        )
        timeout_ms = self._remaining_ms(30)
        if is_input:
            await self._call(target.set_input_files(payloads, timeout=timeout_ms), "attaching")
        else:
            async with self.page.expect_file_chooser(timeout=timeout_ms) as chooser_info:
                await self._call(target.click(timeout=timeout_ms), "opening the file chooser")
            chooser = await chooser_info.value
            await self._call(chooser.set_files(payloads, timeout=timeout_ms), "attaching")
        if spec.upload_done:
            done = self._loc(spec.upload_done).nth(len(images) - 1)
            await self._call(
                done.wait_for(state="visible", timeout=self._remaining_ms(120)),
                "waiting for the attachment to be ready",
            )

    async def wait_answer(self, before: str | None) -> str | None:
        """Wait for the generation to end; return the answer text (None for
        an answer of media only).

        Finished means: the busy marker (if any) has gone, the answer has
        text or new media, and either the `done` marker is visible (and is
        this answer's: hidden at some moment since the prompt, or the busy
        marker seen since, or showing the answer's own text) or the answer
        (text and media count) has not changed for `stable_ms`. An error
        banner fails the attempt with its text. While the page stays busy, an
        answer unchanged for `stall_s` is a stalled generation: the attempt
        fails as `stalled`.
        """
        spec = self.spec
        clock = self.ctx.clock
        started = False
        # A marker that showed before the prompt counts once seen hidden (or
        # once the page showed itself busy since).
        done_armed = not self._done_before
        last_text: str | None = None
        last_change = clock.monotonic()
        last_media = 0
        navigations = 0
        while True:
            self.ctx.check_canceled()
            if self.budget.remaining(clock) <= 0:
                raise self.budget.exceeded("waiting for the answer")
            try:
                look = await self._look()
                await self._raise_hold(look.hold)
            except TransientError as exc:
                # A site that signs the session out (or hits a check) often
                # navigates: the look meets a page that is going away. Look
                # again at the page it lands on, which says what happened,
                # rather than spending the attempt on a browser error.
                if not navigated(exc) or navigations >= MAX_PAGE_NAVIGATIONS:
                    raise
                navigations += 1
                await self._call(
                    self.page.wait_for_load_state(
                        "domcontentloaded", timeout=self._remaining_ms(PAGE_READY_S)
                    ),
                    "waiting for the page the site navigated to",
                )
                continue
            error_shown, logged_out, busy, text = look.error, look.logged_out, look.busy, look.text
            if error_shown:
                shown = await self._text(spec.error, "reading the error banner")
                raise TransientError(
                    f"the page shows an error: {shown or '(no text)'}", kind="page_error"
                )
            if logged_out:
                raise self._logged_out_error()
            if too_long(text):
                raise looks.answer_too_long()
            now = clock.monotonic()
            media = look.media
            if text != last_text or media != last_media:
                last_text, last_media, last_change = text, media, now
            new_media = media > self._media_before
            if busy or (text is not None and text != before) or new_media:
                started = True
            if busy or not look.done:
                # Hidden since the prompt, or the page showed it generating
                # since: a marker visible once it is no longer busy is this
                # answer's end, and ends the wait at once (no `stable_ms`).
                done_armed = True
            if (busy or not started) and now - last_change >= self.stall_s:
                # The page answers our looks, but its answer does not move.
                raise TransientError(
                    f"stalled: the answer has not changed for {spec.stall_s:g} s "
                    "(the profile's stall_s) while the page still shows it generating",
                    kind="stalled",
                )
            # The done marker must be on this answer, not on an earlier one.
            marked = look.done and (
                done_armed or (look.done_text is not None and look.done_text == text)
            )
            answered = bool(text) or new_media
            if started and not busy and answered and (marked or now - last_change >= self.stable_s):
                self.finished_media = media
                return text or None
            await self._until_next_look(look)

    async def _until_next_look(self, look: Look) -> None:
        """Wait for the next look: until the page changes what decides the
        end, or `poll_s` (`busy_look_s` while busy) at most.

        A generation's end shows as the busy marker going hidden or a done
        marker appearing. While the page shows itself busy, the wait runs in
        the page (`_until_busy_changes`): it wakes at the marker's change, and
        costs nothing meanwhile. A done marker still to come is waited for by
        Playwright (it polls the page every ~20 ms). Whatever else the page
        shows (an error, a logout, a cap, a stall) the next look reads."""
        spec = self.spec
        if spec.busy and look.busy:
            await self._until_busy_changes(spec.busy)
            return
        if not (spec.done and not look.done):
            await self.ctx.guard(asyncio.sleep(self.poll_s))
            return
        # Only while the marker is hidden: one showing already would satisfy
        # the wait at once and turn the loop into a busy poll.
        target = self._loc(spec.done).first
        try:
            await self._call(
                target.wait_for(state="visible", timeout=self.poll_s * 1000),
                "waiting for the page to change",
            )
        except TransientError as exc:
            # Nothing changed within `poll_s` (or the page navigated): look.
            if exc.kind != "timeout" and not navigated(exc):
                raise

    async def _until_busy_changes(self, busy: str) -> None:
        """Until the busy marker's visibility changes, or `busy_look_s`
        (`pagewait.until_shown_changes`); `poll_s` when the page's own
        script breaks that wait, or the wait keeps seeing the marker other
        than the looks do (waking at once would turn the loop into a busy
        poll)."""
        why = await until_shown_changes(
            self.ctx,
            self._loc(busy),
            seen=True,
            wait_s=self.busy_look_s,
            budget=self.budget,
            css=plain_css(busy) if self._plain_page else None,
        )
        differed, self._wait_differed = self._wait_differed, why == "differs"
        if why == "unavailable" or (differed and why == "differs"):
            await self.ctx.guard(asyncio.sleep(self.poll_s))

    async def click_stop(self) -> bool:
        """Click the profile's stop control if it is showing; bounded, never raises.

        Then wait (briefly) for the busy marker to go: the click only sends a
        request, and closing the browser at once could drop it, leaving the
        site generating for a conversation nobody watches.
        """
        if not self.spec.stop or not self.submitted:
            return False
        stop = self._loc(self.spec.stop).first
        try:
            async with asyncio.timeout(STOP_CLICK_S):
                if not await stop.is_visible():
                    return False
                await stop.click(timeout=STOP_CLICK_S * 1000)
        except (PlaywrightError, TimeoutError):
            return False
        if self.spec.busy:
            with contextlib.suppress(PlaywrightError, TimeoutError):
                async with asyncio.timeout(STOP_CLICK_S):
                    busy = self._loc(self.spec.busy).first
                    await busy.wait_for(state="hidden", timeout=STOP_CLICK_S * 1000)
        return True

    # -- media -------------------------------------------------------------

    async def media_sources(self) -> list[str]:
        """The finished answer's media URLs."""
        if self.finished_media == 0:
            # The look that saw the answer finished counted none on the page
            # (a page is loaded fresh for each task): nothing to list, and
            # one round trip fewer after every text answer.
            return []
        sources = await self._media_list()
        if len(sources) > looks.MAX_MEDIA:
            raise looks.too_many_media(max(self.finished_media or 0, len(sources)))
        base = self.page.url
        return [urljoin(base, str(src)) for src in sources if src]
