"""The result cache copies files in worker threads, never on the event loop."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

import dispatcher.tasks.cache as cache_module
from dispatcher.scheduling.decisions import DEDUP_WINDOW_S
from tests.support.harness import running_service


async def test_cache_file_copies_run_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    copied_on: list[int] = []
    original = cache_module._link_or_copy

    def recording(src: Path, dst: Path) -> None:
        copied_on.append(threading.get_ident())
        original(src, dst)

    monkeypatch.setattr(cache_module, "_link_or_copy", recording)
    task = {"model": "demo-video", "params": {"prompt": "cache me off the loop", "gen_s": 1}}
    async with running_service(tmp_path) as h:
        first = await h.job("first", [task])
        done = await h.wait_job(first["id"])
        assert done["tasks"][0]["state"] == "success", done
        deadline = asyncio.get_running_loop().time() + 10
        while h.service.cache.stored < 1:  # stored just after the task is marked done
            assert asyncio.get_running_loop().time() < deadline, "never cached"
            await asyncio.sleep(0.01)
        stored_copies = len(copied_on)  # into the cache, when the task finished
        again = await h.job("again", [task])  # a job never de-duplicates: a cache hit
        assert again["tasks"][0]["from_cache"], again
        (file,) = again["tasks"][0]["result"]["files"]
        assert Path(file["path"]).is_file()
    assert stored_copies >= 1 and len(copied_on) > stored_copies
    assert threading.get_ident() not in copied_on


async def test_identical_submits_racing_through_the_cache_make_one_task(tmp_path: Path) -> None:
    # The scaled de-dup window (1.5 s here) must outlast four submits on a
    # loaded machine: at 0.005 it was 0.15 s, and a slow cache copy let the
    # last submit fall outside its twin's window.
    time_scale = 0.05
    async with running_service(tmp_path, time_scale=time_scale) as h:
        first = await h.submit("demo-video", "race me", gen_s=1)
        assert (await h.wait_task(first["id"]))["state"] == "success"
        deadline = asyncio.get_running_loop().time() + 10
        while h.service.cache.stored < 1:
            assert asyncio.get_running_loop().time() < deadline, "never cached"
            await asyncio.sleep(0.01)
        # Past the de-duplication window, so the next ones are cache hits.
        await asyncio.sleep(DEDUP_WINDOW_S * time_scale + 0.05)
        answers = await asyncio.gather(
            *(h.submit("demo-video", "race me", gen_s=1) for _ in range(4))
        )
        assert len({a["id"] for a in answers}) == 1, answers
        assert sum(not a["deduped"] for a in answers) == 1
        assert answers[0]["from_cache"]
        results = h.state_dir / "results"
        assert {p.name for p in results.iterdir()} == {first["id"], answers[0]["id"]}


async def test_a_lanes_next_task_does_not_wait_for_the_cache_to_keep_the_last_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A slow disk, as beside busy browsers: linking the first video into the
    # cache takes until the test says so. The provider's one slot must go to
    # the next task as soon as the first task's end is written, not after.
    disk_free = threading.Event()
    original = cache_module._link_or_copy

    def slow_disk(src: Path, dst: Path) -> None:
        assert disk_free.wait(30), "the test never let the disk go"
        original(src, dst)

    monkeypatch.setattr(cache_module, "_link_or_copy", slow_disk)
    async with running_service(tmp_path, concurrency={"demo": 1}) as h:
        try:
            first = await h.submit("demo-video", "kept slowly", gen_s=1)
            second = await h.submit("demo-video", "next in the slot", gen_s=1)
            assert (await h.wait_task(second["id"]))["state"] == "success"
            assert (await h.task(first["id"]))["state"] == "success"
            assert h.service.cache.stored == 0  # both still being linked in
        finally:
            disk_free.set()
        deadline = asyncio.get_running_loop().time() + 10
        while h.service.cache.stored < 2:
            assert asyncio.get_running_loop().time() < deadline, "never cached"
            await asyncio.sleep(0.01)
        again = await h.job(
            "again", [{"model": "demo-video", "params": {"prompt": "kept slowly", "gen_s": 1}}]
        )
        assert again["tasks"][0]["from_cache"], again
