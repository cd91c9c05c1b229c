"""De-duplication, the result cache, write discipline and start-up reconciliation."""

from __future__ import annotations

import asyncio
import math
from dataclasses import replace
from pathlib import Path

from dispatcher.models import Kind, Stage, State, Task
from dispatcher.scheduling.decisions import HEARTBEAT_INTERVAL_S
from dispatcher.store.sqlite import SqliteStore
from tests.support.harness import running_service

TIME_SCALE = 0.02
DEDUP_WINDOW_REAL_S = 30 * TIME_SCALE


async def test_three_rapid_identical_submissions_make_one_remote_job(tmp_path: Path) -> None:
    async with running_service(tmp_path, time_scale=TIME_SCALE) as h:
        answers = await asyncio.gather(
            *[h.submit("demo-video", "the same clip", gen_s=2) for _ in range(3)]
        )
        ids = {a["id"] for a in answers}
        assert len(ids) == 1
        assert sorted(a["deduped"] for a in answers) == [False, True, True]
        # Noise the fingerprint ignores: zero-width, full-width, spacing, unrelated fields.
        noisy = await h.submit("demo-video", "  the\u200b same　clip ", gen_s=2, request_id="abc")
        assert noisy["deduped"] and noisy["id"] in ids
        done = await h.wait_task(ids.pop())
        assert done["state"] == "success"
        stats = await h.demo_stats()
        assert stats["jobs_created"] == 1


async def test_force_bypasses_dedup_and_cache(tmp_path: Path) -> None:
    async with running_service(tmp_path, time_scale=TIME_SCALE) as h:
        first = await h.submit("demo-chat-api", "force me")
        forced = await h.submit("demo-chat-api", "force me", force=True)
        assert forced["id"] != first["id"] and not forced["deduped"]
        await h.wait_task(first["id"])
        await h.wait_task(forced["id"])
        again = await h.submit("demo-chat-api", "force me", force=True)
        assert not again["from_cache"]
        await h.wait_task(again["id"])
        assert (await h.demo_stats())["chat_completions"] == 3


async def test_identical_task_after_the_window_completes_from_cache(tmp_path: Path) -> None:
    async with running_service(tmp_path, time_scale=TIME_SCALE) as h:
        first = await h.submit("demo-video", "cache me", gen_s=1)
        done = await h.wait_task(first["id"])
        assert done["state"] == "success" and not done["from_cache"]
        await asyncio.sleep(DEDUP_WINDOW_REAL_S + 0.1)
        before = await h.demo_stats()
        second = await h.submit("demo-video", "cache me", gen_s=1)
        assert second["state"] == "success" and second["from_cache"] and not second["deduped"]
        assert second["id"] != first["id"]
        assert (await h.demo_stats())["requests"] == before["requests"]  # zero remote requests
        (cached_file,) = second["result"]["files"]
        (original,) = done["result"]["files"]
        assert cached_file["sha256"] == original["sha256"]
        assert Path(cached_file["path"]).is_file() and cached_file["path"] != original["path"]
        metrics = (await h.http.get("/metrics")).text
        assert "dispatcher_cache_hits_total 1.0" in metrics


async def test_store_writes_per_task_stay_within_transitions_and_heartbeats(tmp_path: Path) -> None:
    async with running_service(tmp_path, time_scale=TIME_SCALE) as h:
        chat = await h.submit("demo-chat-api", "count my writes", gen_s=1)
        video = await h.submit("demo-video", "count mine too", gen_s=8)
        chat_done = await h.wait_task(chat["id"])
        video_done = await h.wait_task(video["id"])
        store = h.service.store
        assert isinstance(store, SqliteStore)  # the write audit is the SQLite backend's
        writes = store.writes
        heartbeat_real_s = HEARTBEAT_INTERVAL_S * TIME_SCALE
        for task, transitions in ((chat_done, 3), (video_done, 4)):  # +1: the remote id
            run_s = task["finished_at"] - task["started_at"]
            heartbeats = math.ceil(run_s / heartbeat_real_s)
            assert writes[task["id"]] <= transitions + heartbeats, (task["id"], writes[task["id"]])
            assert writes[task["id"]] >= transitions
        # Progress moved many times but lives in memory: far fewer writes than polls.
        assert (await h.demo_stats())["polls"] > writes[video["id"]] - 4


async def _left_running(store: SqliteStore, now: float) -> dict[str, Task]:
    base = Task(
        id="",
        model="demo-video",
        kind=Kind.API,
        queue="api-model:demo-video",
        params={"prompt": "x", "gen_s": 1},
        fingerprint="",
        created_at=now - 10,
        state=State.RUNNING,
        stage=Stage.GENERATING,
        started_at=now - 10,
        heartbeat_at=now - 5,
        owner="demo",
    )
    tasks = {
        "no-remote": replace(base, id="no-remote", fingerprint="a"),
        "unknown-remote": replace(
            base, id="unknown-remote", fingerprint="b", remote_id="video_gone"
        ),
        "expired": replace(
            base, id="expired", fingerprint="c", started_at=now - 3 * 3600, remote_id="video_x"
        ),
        "web": replace(
            base,
            id="web",
            model="demo-chat-api",
            fingerprint="d",
            kind=Kind.WEB,
            queue="web:no-lane-here",
        ),
    }
    await store.insert_tasks(list(tasks.values()))
    return tasks


async def test_startup_reconciliation_rules(tmp_path: Path) -> None:
    import time

    state = tmp_path / "state"
    state.mkdir()
    store = SqliteStore(state / "dispatcher.db")
    await store.migrate()
    await _left_running(store, time.time())
    await store.close()
    async with running_service(tmp_path, state_dir=state, time_scale=TIME_SCALE) as h:
        assert h.service.recovery_summary == {"resume": 1, "requeue": 1, "stale": 1, "expire": 1}
        requeued = await h.wait_task("no-remote")
        assert requeued["state"] == "success" and requeued["attempt"] == 1  # same attempt
        expired = await h.task("expired")
        assert expired["state"] == "failed", expired
        assert expired["error"]["kind"] == "expired", expired
        stale = await h.task("web")
        # Stale: the retry rule re-queued it on a new attempt (no lane takes it here).
        assert stale["state"] == "pending" and stale["attempt"] == 2
        assert stale["error"]["kind"] == "stale"
        unknown = await h.wait_task("unknown-remote")
        assert unknown["state"] == "failed"
        # The vendor no longer knows the job: failed for good, with the vendor's own words.
        assert unknown["error"] == {
            "kind": "http_404",
            "message": "HTTP 404: not_found: no job 'video_gone'",
        }
