"""`dispatcher profiles try`: one prompt through a web profile, in the foreground.

How an operator writes a profile for a site the project has never seen: each
step prints as it happens (page loaded, logged in, fields set, submitted,
busy seen, answer growing, done, media found) with a screenshot per step in
a folder, and a failure names the profile's selectors that match nothing on
the page, with what the page shows nearest to each.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from playwright.async_api import Error as PlaywrightError
from playwright.async_api import Page

from dispatcher.clock import Clock
from dispatcher.errors import DispatcherError
from dispatcher.models import Kind, Stage, Task, new_id
from dispatcher.profiles import Profile, WebSpec
from dispatcher.scheduling.protocol import RunContext
from dispatcher.tasks.fingerprint import LocalFiles
from webrunner.browserrun import close_logged
from webrunner.fields import set_fields
from webrunner.page import PAGE_READY_S, PageDriver, compose_message
from webrunner.pagestep import Budget
from webrunner.runner import WebRunner
from webrunner.snapshot import first_text

Say = Callable[[str], None]
# Real seconds between two looks of the watcher at a generating page.
WATCH_S = 0.5
SHOT_S = 5.0
# The selectors that should match at each phase: a failure names those of
# its phase that match nothing (an answer's selectors match nothing before
# the prompt is sent, and that is no news).
BEFORE_KEYS = ("logged_in", "input", "submit", "fields")
FINISHED_KEYS = ("answer", "done", "media")
SELECTOR_KEYS = BEFORE_KEYS + FINISHED_KEYS


@dataclass
class Trial:
    """Where the steps go: printed, and a screenshot each in `shots`."""

    say: Say
    shots: Path
    taken: list[Path] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)

    async def step(self, page: Page | None, name: str, detail: str = "") -> None:
        elapsed = time.monotonic() - self.started
        shot = ""
        if page is not None:
            slug = re.sub(r"[^a-z0-9]+", "-", name)
            path = self.shots / f"{len(self.taken) + 1:02d}-{slug}.png"
            with contextlib.suppress(PlaywrightError, TimeoutError):
                async with asyncio.timeout(SHOT_S):
                    await page.screenshot(path=path, timeout=SHOT_S * 1000)
                self.taken.append(path)
                shot = f"  [{path.name}]"
        self.say(f"{elapsed:6.1f} s  {name}{': ' + detail if detail else ''}{shot}")


async def diagnose(page: Page, spec: WebSpec, keys: tuple[str, ...] = SELECTOR_KEYS) -> list[str]:
    """A line per selector of the profile that matches nothing on the page,
    with the nearest thing the page does show: the longest leading part of
    the selector that matches, and the start of its HTML."""
    lines: list[str] = []
    named = [(key, getattr(spec, key)) for key in keys if key != "fields"]
    if "fields" in keys:
        named += [(f"fields.{name}", selector) for name, selector in spec.fields.items()]
    for key, selector in named:
        if not selector:
            continue
        try:
            count = await page.locator(selector).count()
        except PlaywrightError as exc:
            lines.append(f"`{key}` = {selector!r} is not a valid selector: {exc.message[:200]}")
            continue
        if count:
            continue
        lines.append(f"`{key}` = {selector!r} matches nothing; {await _nearest(page, selector)}")
    return lines


# What a found element holds, in selector form: the controls and the named
# elements inside it (what a profile's selector would point at), and its text.
_OUTLINE_JS = """e => {
  const found = [];
  const walk = el => {
    for (const c of el.children) {
      if (found.length >= 12) return;
      const tag = c.tagName.toLowerCase();
      if (['svg', 'style', 'script', 'template'].includes(tag)) continue;
      let name = tag;
      if (c.id) name += '#' + c.id;
      for (const a of ['data-testid', 'type', 'aria-label', 'role']) {
        const v = c.getAttribute(a);
        if (v) name += '[' + a + '=' + JSON.stringify(v) + ']';
      }
      if (name !== tag || ['input', 'textarea', 'select', 'button', 'img', 'video'].includes(tag))
        found.push(name);
      walk(c);
    }
  };
  walk(e);
  return [found, String(e.innerText || '').trim().slice(0, 1000)];
}"""


async def _nearest(page: Page, selector: str) -> str:
    parts = selector.split()
    for end in range(len(parts) - 1, 0, -1):
        prefix = " ".join(parts[:end])
        with contextlib.suppress(PlaywrightError):
            found = page.locator(prefix)
            if await found.count():
                inside, text = await found.first.evaluate(_OUTLINE_JS)
                held = ", ".join(str(x) for x in inside) or "no control"
                return f"nearest: {prefix!r} holds {held}; its text: {_squeeze(str(text), 120)}"
    with contextlib.suppress(PlaywrightError, TimeoutError):
        async with asyncio.timeout(2.0):
            text = await first_text(page.locator("body"))
        return f"the page ({page.url}) shows: {_squeeze(text or '')}"
    return f"the page is {page.url}"


def _squeeze(text: str, limit: int = 300) -> str:
    flat = " ".join(text.split())
    return repr(flat[:limit] + ("…" if len(flat) > limit else ""))


async def _watch(driver: PageDriver, trial: Trial, stop: asyncio.Event) -> None:
    """Print what changes while the page generates: busy, the answer, media."""
    spec, page = driver.spec, driver.page
    busy_seen = False
    last_text: str | None = None
    last_media = 0
    while not stop.is_set():
        # A look cut short (the page navigating, a slow call) changes nothing.
        busy, text, media = busy_seen, last_text, last_media
        with contextlib.suppress(PlaywrightError, TimeoutError):
            async with asyncio.timeout(WATCH_S * 4):
                busy = bool(spec.busy and await page.locator(spec.busy).first.is_visible())
                text = await first_text(page.locator(spec.answer))
                media = await page.locator(spec.media).count() if spec.media else 0
            if busy and not busy_seen:
                busy_seen = True
                await trial.step(page, "busy seen", repr(spec.busy))
            if text and text != last_text:
                last_text = text
                await trial.step(page, "answer growing", f"{len(text)} chars: {_squeeze(text, 80)}")
            if media != last_media:
                last_media = media
                await trial.step(page, "media on the page", str(media))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), WATCH_S)


async def try_profile(
    runner: WebRunner,
    profile: Profile,
    account: str,
    prompt: str,
    params: dict[str, Any],
    *,
    clock: Clock,
    files: LocalFiles,
    out: Path,
    say: Say,
) -> bool:
    """Run the prompt once; True when an answer came. Never retries."""
    spec = profile.web
    assert spec is not None
    await asyncio.to_thread(out.mkdir, parents=True, exist_ok=True)
    trial = Trial(say, out)
    task = Task(
        id=new_id(),
        model=profile.name,
        kind=Kind.WEB,
        queue=profile.queue,
        params={**params, "prompt": prompt},
        fingerprint="profiles-try",
        created_at=clock.now(),
    )
    log = logging.LoggerAdapter(logging.getLogger("dispatcher.profiles.try"), {})

    async def stage(stage: Stage, progress: float | None, position: int | None) -> None:
        return None

    async def remote(remote_id: str) -> None:
        return None

    ctx = RunContext(
        task=task,
        profile=profile,
        lane=f"web:{account}",
        owner=account,
        clock=clock,
        result_dir=out / "result",
        log=log,
        report_stage=stage,
        record_remote_id=remote,
    )
    session = await runner.launch_browser(account, spec, log)
    page: Page | None = None
    submitted = False
    try:
        await trial.step(None, "browser started", f"pid {session.pid}")
        page = await session.page()
        driver = PageDriver(
            page, spec, ctx, budget=Budget.after(clock, PAGE_READY_S, f"{PAGE_READY_S:.0f} s")
        )
        await driver.open()
        await trial.step(page, "page loaded, logged in", f"{page.url} shows {spec.logged_in!r}")
        driver.budget = Budget.after(
            clock, clock.scaled(spec.timeout_s), f"the profile's timeout_s ({spec.timeout_s:g} s)"
        )
        if spec.fields:
            shown = await set_fields(driver, task.params, files)
            await trial.step(page, "fields set", ", ".join(shown) or "none given")
        before = await driver.submit(compose_message(spec, prompt))
        submitted = True
        await trial.step(page, "submitted")
        stop = asyncio.Event()
        watcher = asyncio.create_task(_watch(driver, trial, stop))
        try:
            text = await driver.wait_answer(before)
        finally:
            stop.set()
            await watcher
        await trial.step(page, "done", _squeeze(text) if text else "(no text)")
        sources = await driver.media_sources()
        if sources:
            listed = ", ".join(s[:80] for s in sources)
            await trial.step(page, "media found", f"{len(sources)}: {listed}")
        elif spec.media:
            await trial.step(page, "no media", f"{spec.media!r} matches nothing")
        say(f"answer: {text!r}" if text else "answer: (no text)")
        # An answer came, but a selector that should show the finished
        # answer may still be wrong (media alone can finish an answer).
        for line in await diagnose(page, spec, FINISHED_KEYS):
            say(f"  warning: {line}")
        return True
    except DispatcherError as exc:
        await trial.step(page, "failed", f"{type(exc).__name__}: {exc}")
        if page is not None and not page.is_closed():
            keys = FINISHED_KEYS if submitted else BEFORE_KEYS
            for line in await diagnose(page, spec, keys):
                say(f"  {line}")
        return False
    finally:
        say(f"screenshots in {out}")
        await runner.keeper.forget(account)
        await close_logged(session, log)
