"""The real service on a real PostgreSQL database, end to end.

API tasks against the demo vendor and web tasks in real Chromium against
the demo web model; a job, a de-duplicated twin, a cancel, a restart that
finds its tasks again: what a user does, with the rows in PostgreSQL.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import psycopg
import pytest

from tests.support.harness import running_service
from tests.support.pgdb import migrated_database

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]

SCALE = 0.05
PROFILES = ("demo-chat-api", "demo-video", "demo-chat")


async def test_the_service_runs_api_and_web_tasks_on_postgresql(tmp_path: Path) -> None:
    with migrated_database() as url:
        async with running_service(
            tmp_path, profiles=PROFILES, time_scale=SCALE, database_url=url, host_id="pg-host-1"
        ) as h:
            chat = await h.submit("demo-chat-api", "hello from postgres", gen_s=1)
            twin = await h.submit("demo-chat-api", "hello from postgres", gen_s=1)
            assert twin["deduped"] and twin["id"] == chat["id"]
            video = await h.submit("demo-video", "a slow pan", gen_s=4)
            web = await h.submit("demo-chat", "a web answer [duration=5]")
            job = await h.job(
                "mixed",
                [
                    {"model": "demo-chat-api", "params": {"prompt": f"job line {i}", "gen_s": 1}}
                    for i in range(3)
                ]
                + [{"model": "demo-chat", "params": {"prompt": "job web [duration=5]"}}],
            )
            done = await asyncio.gather(
                *(h.wait_task(t["id"], timeout_s=90) for t in (chat, video, web))
            )
            assert [t["state"] for t in done] == ["success"] * 3, done
            assert done[2]["result"]["text"]  # the web model's answer
            finished = await h.wait_job(job["id"], timeout_s=90)
            assert finished["state"] == "success", finished["counts"]
            listed = (await h.http.get("/v1/tasks", params={"q": "job line"})).json()
            assert len(listed["items"]) == 3
            # A long one canceled while it runs ends canceled.
            slow = await h.submit("demo-video", "a very slow pan", gen_s=600)
            await h.wait_task(slow["id"], {"running"})
            await h.http.post(f"/v1/tasks/{slow['id']}/cancel")
            assert (await h.wait_task(slow["id"]))["state"] == "canceled"
            metrics = (await h.http.get("/metrics")).text
            assert "dispatcher" in metrics
        with psycopg.connect(url) as conn:
            rows = conn.execute("SELECT host, state FROM tasks ORDER BY seq").fetchall()
        assert len(rows) == 8
        assert {row[0] for row in rows} == {"pg-host-1"}  # every task ran on this host
        assert [row[1] for row in rows] == ["success"] * 7 + ["canceled"]
        # A restart on the same database finds everything where it was.
        async with running_service(
            tmp_path, profiles=PROFILES, time_scale=SCALE, database_url=url, host_id="pg-host-1"
        ) as h:
            assert (await h.task(video["id"]))["state"] == "success"
            assert h.service.recovery_summary == {
                "resume": 0,
                "requeue": 0,
                "stale": 0,
                "expire": 0,
            }
