"""Transient trouble is retried in place; permanent trouble fails at once."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from apirunner.runner import ApiRunner
from demo.api_provider import video_bytes
from dispatcher.errors import PermanentError, TransientError
from dispatcher.models import Kind
from dispatcher.settings import Settings

if TYPE_CHECKING:
    from tests.integration.apirunner.conftest import Kit


def read_file(path: str) -> bytes:
    return Path(path).read_bytes()


@pytest.mark.parametrize("status", [500, 502, 503])
async def test_5xx_on_submit_is_retried_in_place(kit: Kit, status: int) -> None:
    await kit.demo.mode(mode="5xx", count=3, status=status, only="submit")
    result, _ = await kit.run(kit.task("demo-video", {"prompt": "stubborn", "gen_s": 1}))
    assert result.files
    stats = await kit.demo.stats()
    assert stats["submits"] == 1  # the 5xx answered before the handler ran
    assert stats["faults"] == 3
    assert stats["jobs_created"] == 1


async def test_503_with_retry_after_holds_the_lane(kit: Kit) -> None:
    await kit.demo.mode(mode="5xx", count=1, status=503, retry_after_s=1, header="seconds")
    loop = asyncio.get_running_loop()
    start = loop.time()
    result, _ = await kit.run(kit.task("demo-queue", {"prompt": "overloaded", "gen_s": 1}))
    assert result.files
    assert loop.time() - start >= 1.0
    stats = await kit.demo.stats()
    assert stats["early_requests"] == 0, stats["early_log"]
    assert stats["jobs_created"] == 1


async def test_5xx_and_drops_while_polling_do_not_fail_the_task(kit: Kit) -> None:
    await kit.demo.mode(mode="5xx", count=2, only="poll")
    await kit.demo.mode(mode="drop", count=2, only="poll")
    result, _ = await kit.run(kit.task("demo-video", {"prompt": "bumpy", "gen_s": 3}))
    assert result.files
    assert (await kit.demo.stats())["jobs_created"] == 1


async def test_a_connection_dropped_before_the_submit_is_retried(kit: Kit) -> None:
    await kit.demo.mode(mode="drop", count=2, only="submit", when="before")
    result, _ = await kit.run(kit.task("demo-queue", {"prompt": "flaky net"}))
    assert result.files
    stats = await kit.demo.stats()
    assert (stats["jobs_created"], stats["duplicate_submits"]) == (1, 0)


async def test_an_answer_lost_after_the_job_was_made_never_makes_a_second_job(kit: Kit) -> None:
    # The provider made the job, then the connection broke before we heard
    # the id. The retry carries the same Idempotency-Key: the provider hands
    # back the job it already has.
    await kit.demo.mode(mode="drop", count=1, only="submit", when="after")
    task = kit.task("demo-video", {"prompt": "lost answer", "gen_s": 1})
    result, recorder = await kit.run(task)
    assert result.files
    assert len(recorder.remote_ids) == 1
    stats = await kit.demo.stats()
    assert stats["jobs_created"] == 1
    assert stats["duplicate_submits"] == 1  # the replay, recognised by its key


async def test_a_broken_download_is_retried_without_resubmitting(kit: Kit) -> None:
    await kit.demo.mode(mode="drop", count=2, only="content", when="mid")
    result, _ = await kit.run(kit.task("demo-video", {"prompt": "half a file", "gen_s": 1}))
    [file] = result.files
    expected = video_bytes("half a file")
    assert read_file(file.path) == expected
    assert file.sha256 == hashlib.sha256(expected).hexdigest()
    stats = await kit.demo.stats()
    assert (stats["jobs_created"], stats["submits"], stats["downloads"]) == (1, 1, 3)


async def test_a_dropped_chat_request_is_retried(kit: Kit) -> None:
    await kit.demo.mode(mode="drop", count=1, only="chat", when="after")
    result, _ = await kit.run(kit.task("demo-chat-api", {"prompt": "again"}))
    assert result.text == "echo: again"


async def test_timeouts_are_retried(kit: Kit, tmp_path: Path) -> None:
    # One poll answers after 1.5 s real; the client gives up on reads at 0.4 s.
    settings = Settings(state_dir=tmp_path / "s", http_timeout_s=0.4)
    api = {name: p for name, p in kit.profiles.items() if p.kind is Kind.API}
    runner = ApiRunner(settings, api, kit.clock, {"demo": 3, "demo-queue": 3})
    await runner.start()
    try:
        await kit.demo.mode(mode="slow", count=1, only="poll", delay_s=75)
        task = kit.task("demo-video", {"prompt": "patience", "gen_s": 2})
        ctx, _ = kit.ctx(task)
        result = await runner.run(task, ctx)
    finally:
        await runner.aclose()
    assert result.files


async def test_a_permanent_4xx_fails_at_once(kit: Kit) -> None:
    with pytest.raises(PermanentError) as info:
        await kit.run(kit.task("demo-video", {"prompt": "bad request [status=400]"}))
    assert info.value.kind == "http_400"
    stats = await kit.demo.stats()
    assert (stats["requests"], stats["jobs_created"]) == (1, 0)  # not one retry


async def test_a_missing_api_key_is_a_permanent_401(
    kit: Kit, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DEMO_API_KEY")
    with pytest.raises(PermanentError) as info:
        await kit.run(kit.task("demo-chat-api", {"prompt": "who am I"}))
    assert info.value.kind == "http_401"
    stats = await kit.demo.stats()
    assert (stats["requests"], stats["unauthorized"]) == (1, 1)


async def test_a_content_refusal_in_chat_is_permanent(kit: Kit) -> None:
    with pytest.raises(PermanentError) as info:
        await kit.run(kit.task("demo-chat-api", {"prompt": "[fail=permanent] something"}))
    assert info.value.kind == "refused"
    assert (await kit.demo.stats())["requests"] == 1


async def test_a_remote_job_failing_for_its_content_is_permanent(kit: Kit) -> None:
    with pytest.raises(PermanentError) as info:
        await kit.run(kit.task("demo-video", {"prompt": "[fail=permanent] x", "gen_s": 1}))
    assert info.value.kind == "remote_failed"
    assert "moderation" in info.value.message


async def test_a_remote_job_failing_for_its_own_reasons_is_retryable(kit: Kit) -> None:
    await kit.demo.mode(mode="fail_jobs", count=1, reason="transient")
    with pytest.raises(TransientError) as info:
        await kit.run(kit.task("demo-queue", {"prompt": "unlucky", "gen_s": 1}))
    assert info.value.kind == "remote_failed"
    # The job that failed was this attempt's; the next attempt gets a fresh one.
    result, _ = await kit.run(kit.task("demo-queue", {"prompt": "lucky", "gen_s": 1}))
    assert result.files


async def test_a_provider_that_keeps_failing_ends_the_attempt_as_transient(kit: Kit) -> None:
    await kit.demo.mode(mode="5xx", count=50, only="chat")
    with pytest.raises(TransientError) as info:
        await kit.run(kit.task("demo-chat-api", {"prompt": "down"}))
    assert info.value.kind == "http_503"
    assert (await kit.demo.stats())["faults"] == 5  # MAX_ERRORS_IN_PLACE tries, then give up
