"""`page_step` (the run's guard with a phase budget, Playwright errors) and page helpers."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from playwright.async_api import Error as PlaywrightError
from playwright.async_api import TimeoutError as PlaywrightTimeoutError

from dispatcher.errors import PermanentError, TaskCanceled, TransientError
from dispatcher.fetch import result_file_name
from dispatcher.models import Kind, Task
from dispatcher.profiles import Profile, WebSpec
from dispatcher.scheduling.protocol import Interruption, RunContext
from dispatcher.testing import run_context
from webrunner.media import _save_data_url
from webrunner.page import compose_message
from webrunner.pagestep import Budget, page_step


def spec(**changes: object) -> WebSpec:
    base: dict[str, object] = {
        "url": "http://127.0.0.1:9/chat",
        "logged_in": "#composer",
        "input": "textarea",
        "submit": "#send",
        "answer": ".answer",
        "instructions": "Answer briefly.",
    }
    return WebSpec.model_validate({**base, **changes})


def context(tmp_path: Path) -> RunContext:
    profile = Profile.model_validate(
        {"name": "m", "kind": "web", "accounts": ["a"], "web": spec().model_dump()}
    )
    task = Task(
        id="t",
        model="m",
        kind=Kind.WEB,
        queue="web:m",
        params={"prompt": "p"},
        fingerprint="f",
        created_at=0.0,
    )
    return run_context(task, profile, owner="a", result_dir=tmp_path)


def budget(seconds: float) -> Budget:
    return Budget(time.monotonic() + seconds, f"{seconds:g} s")


def test_instructions_come_first_unless_the_model_wants_an_empty_prompt() -> None:
    assert compose_message(spec(), "hi") == "Answer briefly.\n\nhi"
    assert compose_message(spec(need_empty_prompt=True), "hi") == "hi"
    assert compose_message(spec(instructions=""), "hi") == "hi"


async def test_a_call_that_returns_beats_once(tmp_path: Path) -> None:
    ctx = context(tmp_path)
    before = ctx.last_beat_monotonic
    await asyncio.sleep(0.01)

    async def quick() -> int:
        return 7

    assert await page_step(ctx, quick(), what="x", budget=budget(5)) == 7
    assert ctx.last_beat_monotonic > before


async def test_a_call_that_never_returns_does_not_beat_and_hits_the_deadline(
    tmp_path: Path,
) -> None:
    ctx = context(tmp_path)
    before = ctx.last_beat_monotonic
    frozen: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    started = time.monotonic()
    with pytest.raises(TransientError) as caught:
        await page_step(ctx, frozen, what="reading", budget=Budget(started + 0.6, "12 s"))
    assert caught.value.kind == "timeout"
    assert str(caught.value) == "timed out after 12 s while reading"
    # Ended by the deadline (0.6 s), not by the call: the upper bound only
    # says it ended, and is loose for a busy machine.
    assert 0.5 < time.monotonic() - started < 10
    assert ctx.last_beat_monotonic == before
    assert frozen.cancelled()


async def test_playwright_errors_become_transient_errors_named_by_the_step(
    tmp_path: Path,
) -> None:
    ctx = context(tmp_path)

    async def page_closed() -> None:
        raise PlaywrightError("Target page, context or browser has been closed\nCall log: ...")

    async def slow_selector() -> None:
        raise PlaywrightTimeoutError("Timeout 30000ms exceeded.")

    with pytest.raises(TransientError) as caught:
        await page_step(ctx, page_closed(), what="clicking submit", budget=budget(5))
    assert caught.value.kind == "browser"
    assert str(caught.value) == ("clicking submit: Target page, context or browser has been closed")
    with pytest.raises(TransientError) as caught:
        await page_step(ctx, slow_selector(), what="typing the prompt", budget=budget(5))
    assert caught.value.kind == "timeout"


async def test_a_cancel_is_noticed_at_once_even_on_a_frozen_call(tmp_path: Path) -> None:
    ctx = context(tmp_path)
    frozen: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    step = asyncio.create_task(page_step(ctx, frozen, what="x", budget=budget(30)))
    await asyncio.sleep(0)
    ctx.interrupt(Interruption.CANCELED)
    with pytest.raises(TaskCanceled):
        await step
    assert frozen.cancelled()


def test_media_file_names_are_safe() -> None:
    # Web media are named by the same function as API results (dispatcher.fetch).
    def name(url: str, index: int) -> str:
        return result_file_name(url, None, "image/png", f"media-{index}")

    assert name("http://h/media/a%20b.png?x=1", 0) == "a_b.png"
    assert name("http://h/media/../../etc/passwd.txt", 1) == "passwd.txt"
    assert name("http://h/media/../../etc/passwd", 1) == "media-1.png"  # no extension: ours
    assert name("http://h/", 2) == "media-2.png"
    assert len(name("http://h/" + "n" * 300 + ".png", 3)) <= 120


def test_data_urls_are_saved_with_their_type(tmp_path: Path) -> None:
    saved = _save_data_url("data:text/plain;base64,aGVsbG8=", tmp_path / "x", 1024)
    assert (saved.size, saved.content_type) == (5, "text/plain")
    assert (tmp_path / "x").read_bytes() == b"hello"


def test_a_data_url_over_the_cap_is_refused(tmp_path: Path) -> None:
    with pytest.raises(PermanentError) as caught:
        _save_data_url("data:text/plain;base64," + "aGVsbG8=" * 100, tmp_path / "x", 64)
    assert caught.value.kind == "too_large"
    assert not (tmp_path / "x").exists()
