"""Cancel reaches the provider; a restart resumes a job without resubmitting."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from apirunner.runner import ApiRunner
from dispatcher.clock import SystemClock
from dispatcher.errors import PermanentError, TaskCanceled
from dispatcher.models import Kind, Stage
from dispatcher.scheduling.protocol import Interruption, RunResult
from dispatcher.settings import Settings

if TYPE_CHECKING:
    from tests.integration.apirunner.conftest import Kit


@pytest.mark.parametrize("model", ["demo-video", "demo-queue"])
async def test_cancel_reaches_the_provider_and_raises(kit: Kit, model: str) -> None:
    task = kit.task(model, {"prompt": "too long", "gen_s": 500})
    ctx, recorder = kit.ctx(task)
    running = asyncio.create_task(kit.runner.run(task, ctx))
    await recorder.wait_for(lambda r: any(s is Stage.GENERATING for s, _, _ in r.stages))
    ctx.interrupt(Interruption.CANCELED)
    start = time.monotonic()
    with pytest.raises(TaskCanceled):
        await running
    # The job runs 10 s (500 nominal at scale 0.02): ended by the cancel, not
    # by the job, with room for a busy machine.
    assert time.monotonic() - start < 5.0
    stats = await kit.demo.stats()
    assert stats["cancels"] == 1
    assert stats["active_jobs"] == 0  # the provider stopped the job: quota freed


async def test_cancel_is_noticed_within_a_second_during_a_long_poll_wait(
    kit: Kit, tmp_path: Path
) -> None:
    # An unscaled clock: the first poll wait is a real 2 s.
    api = {name: p for name, p in kit.profiles.items() if p.kind is Kind.API}
    settings = Settings(state_dir=tmp_path / "s")
    runner = ApiRunner(settings, api, SystemClock(), {"demo": 3, "demo-queue": 3})
    await runner.start()
    try:
        task = kit.task("demo-video", {"prompt": "wait for it", "gen_s": 500})
        ctx, recorder = kit.ctx(task)
        running = asyncio.create_task(runner.run(task, ctx))
        await recorder.wait_for(lambda r: bool(r.remote_ids))
        await asyncio.sleep(0.2)
        ctx.interrupt(Interruption.CANCELED)
        start = time.monotonic()
        with pytest.raises(TaskCanceled):
            await running
        assert time.monotonic() - start < 1.0
    finally:
        await runner.aclose()
    stats = await kit.demo.stats()
    assert (stats["polls"], stats["cancels"]) == (0, 1)


async def test_cancel_before_anything_was_sent_sends_nothing(kit: Kit) -> None:
    task = kit.task("demo-video", {"prompt": "never mind"})
    ctx, _ = kit.ctx(task)
    ctx.interrupt(Interruption.CANCELED)
    with pytest.raises(TaskCanceled):
        await kit.runner.run(task, ctx)
    assert (await kit.demo.stats())["requests"] == 0


async def test_cancel_cuts_a_long_chat_request(kit: Kit) -> None:
    task = kit.task("demo-chat-api", {"prompt": "a very long answer", "gen_s": 500})
    ctx, _ = kit.ctx(task)
    running = asyncio.create_task(kit.runner.run(task, ctx))
    await asyncio.sleep(0.1)
    ctx.interrupt(Interruption.CANCELED)
    start = time.monotonic()
    with pytest.raises(TaskCanceled):
        await running
    assert time.monotonic() - start < 5.0  # the answer would take 10 s
    # The request was really torn down: the provider saw its client leave.
    for _ in range(100):
        if (await kit.demo.stats())["hangups"] == 1:
            break
        await asyncio.sleep(0.02)
    assert (await kit.demo.stats())["hangups"] == 1


@pytest.mark.parametrize("model", ["demo-video", "demo-queue"])
async def test_a_restart_resumes_polling_without_resubmitting(kit: Kit, model: str) -> None:
    task = kit.task(model, {"prompt": "survives restarts", "gen_s": 8})
    ctx, recorder = kit.ctx(task)
    running = asyncio.create_task(kit.runner.run(task, ctx))
    await recorder.wait_for(lambda r: bool(r.remote_ids))
    # The service shuts down: the run is cancelled (asyncio), not the job.
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert (await kit.demo.stats())["cancels"] == 0

    resumed_task = task.replace(remote_id=recorder.remote_ids[0])
    ctx2, recorder2 = kit.ctx(resumed_task)
    result: RunResult = await kit.runner.run(resumed_task, ctx2)
    assert result.files
    assert recorder2.remote_ids == []  # nothing new to record: same remote job
    stats = await kit.demo.stats()
    assert (stats["submits"], stats["jobs_created"], stats["duplicate_submits"]) == (1, 1, 0)


async def test_resuming_a_job_that_finished_meanwhile_fetches_its_result(kit: Kit) -> None:
    answer = await kit.demo.http.post(
        f"{kit.demo.url}/v1/videos",
        json={"prompt": "done while away", "gen_s": 1},
        headers={"Authorization": "Bearer test-key"},
    )
    video_id = answer.json()["id"]
    await asyncio.sleep(0.1)  # 1 nominal s at scale 0.02: long finished
    task = kit.task("demo-video", {"prompt": "done while away"}, remote_id=video_id)
    result, _ = await kit.run(task)
    assert result.files and result.meta["polls"] == 1
    assert (await kit.demo.stats())["submits"] == 1


async def test_resuming_an_id_the_provider_does_not_know_fails(kit: Kit) -> None:
    task = kit.task("demo-video", {"prompt": "ghost"}, remote_id="video_unknown")
    with pytest.raises(PermanentError) as info:
        await kit.run(task)
    assert info.value.kind == "http_404"
    assert (await kit.demo.stats())["submits"] == 0
