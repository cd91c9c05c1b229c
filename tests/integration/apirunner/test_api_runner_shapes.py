"""The three bundled shapes work from their profiles alone."""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING

from demo.api_provider import png_bytes, video_bytes
from dispatcher.models import Stage

if TYPE_CHECKING:
    from tests.integration.apirunner.conftest import Kit


def read_file(path: str) -> bytes:
    return Path(path).read_bytes()


async def test_chat_answers_with_text_in_one_request(kit: Kit) -> None:
    result, recorder = await kit.run(
        kit.task("demo-chat-api", {"prompt": "hello there", "seed": 3})
    )
    assert result.text == "echo: hello there"
    assert result.files == []
    assert recorder.remote_ids == []
    assert [stage for stage, _, _ in recorder.stages] == [Stage.GENERATING]
    stats = await kit.demo.stats()
    assert (stats["requests"], stats["chat_completions"]) == (1, 1)


async def test_video_job_submits_polls_and_streams_the_file(kit: Kit) -> None:
    task = kit.task("demo-video", {"prompt": "a cat on a skateboard", "duration": "8", "gen_s": 3})
    result, recorder = await kit.run(task)

    # The remote id is recorded before anything else is reported.
    assert recorder.events[0] == "remote_id"
    assert recorder.remote_ids == [result.meta["remote_id"]]
    assert recorder.remote_ids[0].startswith("video_")
    stages = [stage for stage, _, _ in recorder.stages]
    assert stages[-1] is Stage.DOWNLOADING
    assert set(stages[:-1]) == {Stage.GENERATING}
    assert recorder.stages[-2][1] == 100.0  # the provider's progress, in percent

    [file] = result.files
    expected = video_bytes("a cat on a skateboard")
    data = read_file(file.path)
    assert data == expected
    assert file.size == len(expected)
    assert file.sha256 == hashlib.sha256(expected).hexdigest()
    assert file.content_type == "video/mp4"
    assert file.name.endswith(".mp4")
    assert Path(file.path).parent == kit.result_dir / task.id
    assert not list(Path(file.path).parent.glob("*.part"))

    stats = await kit.demo.stats()
    assert stats["jobs_created"] == 1 and stats["submits"] == 1
    assert stats["downloads"] == 1
    assert stats["duplicate_submits"] == 0
    # First wait 2 s, then 3 s: a 3 s job is seen done by the 2nd poll (a 3rd
    # only if the event loop lagged by more than a whole step).
    assert 1 <= result.meta["polls"] <= 3


async def test_fal_style_job_uses_the_urls_it_was_given(kit: Kit) -> None:
    task = kit.task("demo-queue", {"prompt": "a dog in the rain", "seed": 1})
    result, recorder = await kit.run(task)

    stored = json.loads(recorder.remote_ids[0])
    assert stored["id"] == result.meta["remote_id"]
    assert stored["submit"]["status_url"].endswith("/status")
    [file] = result.files
    expected = png_bytes("a dog in the rain")
    assert read_file(file.path) == expected
    assert (file.content_type, file.size) == ("image/png", len(expected))
    assert file.sha256 == hashlib.sha256(expected).hexdigest()
    stats = await kit.demo.stats()
    assert (stats["jobs_created"], stats["results"], stats["downloads"]) == (1, 1, 1)


async def test_queue_position_is_reported_while_queued(kit: Kit) -> None:
    # Three jobs submitted together, each queued for its first 20 nominal
    # seconds: the first poll (after ~2 s) finds the later ones behind others.
    tasks = [kit.task("demo-queue", {"prompt": f"p{i}", "gen_s": 100}) for i in range(3)]
    outcomes = await asyncio.gather(*(kit.run(task) for task in tasks))
    positions = [q for _, rec in outcomes for _, _, q in rec.stages if q is not None]
    assert max(positions) >= 1
    assert all(result.files for result, _ in outcomes)


async def test_body_template_sends_params_with_their_types(kit: Kit) -> None:
    # gen_s given as a number reaches the provider as a number (the demo
    # rejects anything else), and absent params are simply not sent.
    result, _ = await kit.run(kit.task("demo-video", {"prompt": "typed", "gen_s": 0.5}))
    assert result.files
    result, _ = await kit.run(kit.task("demo-video", {"prompt": "defaults"}))
    assert result.files


async def test_http2_client_pool_per_provider(kit: Kit) -> None:
    assert kit.runner.providers == ["demo", "demo-queue"]
    assert kit.runner.client("demo") is not kit.runner.client("demo-queue")
