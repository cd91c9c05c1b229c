"""Jobs, cancel, retry and the account switches, end to end over HTTP."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.support.harness import running_service


async def test_job_of_api_tasks_runs_to_success(tmp_path: Path) -> None:
    async with running_service(tmp_path) as h:
        tasks = [{"model": "demo-chat-api", "params": {"prompt": f"chat {i}"}} for i in range(4)]
        tasks += [
            {"model": "demo-video", "params": {"prompt": f"clip {i}", "gen_s": 3}} for i in range(3)
        ]
        job = await h.job("mixed", tasks)
        assert job["total"] == 7 and job["state"] == "running"
        done = await h.wait_job(job["id"])
        assert done["state"] == "success", done["counts"]
        assert done["counts"]["success"] == 7
        chat = [t for t in done["tasks"] if t["model"] == "demo-chat-api"]
        assert all("chat" in t["result"]["text"] for t in chat)
        video = [t for t in done["tasks"] if t["model"] == "demo-video"]
        for task in video:
            (file,) = task["result"]["files"]
            assert file["size"] > 0 and len(file["sha256"]) == 64
            download = await h.http.get(f"/v1/tasks/{task['id']}/result")
            assert download.status_code == 200 and len(download.content) == file["size"]
        for task in done["tasks"]:
            assert task["owner"] == "demo" and task["attempt"] == 1
            assert (
                task["started_at"] >= task["created_at"]
                and task["finished_at"] >= task["started_at"]
            )
            assert "dispatched" in task["stage_durations"]


async def test_cancel_pending_and_running_tasks(tmp_path: Path) -> None:
    async with running_service(tmp_path, concurrency={"demo": 1}) as h:
        long = await h.submit("demo-video", "long one", gen_s=400)
        queued = await h.submit("demo-video", "queued behind it", gen_s=1)
        # Canceled once the provider has the job, so there is a job to cancel
        # there (a cancel before the submit is sent stops it from being sent).
        await h.wait_remote_id(long["id"])
        assert (await h.task(queued["id"]))["ahead"] == 0
        third = await h.submit("demo-video", "third", gen_s=1)
        assert (await h.task(third["id"]))["ahead"] == 1

        response = await h.http.post(f"/v1/tasks/{queued['id']}/cancel")
        assert response.json()["state"] == "canceled"
        response = await h.http.post(f"/v1/tasks/{long['id']}/cancel")
        assert response.status_code == 200
        canceled = await h.wait_task(long["id"])
        assert canceled["state"] == "canceled"
        stats = await h.demo_stats()
        assert stats["cancels"] >= 1  # the provider was told
        assert (await h.wait_task(third["id"]))["state"] == "success"


async def test_failed_task_retry_and_job_retry_only_rerun_failures(tmp_path: Path) -> None:
    async with running_service(tmp_path) as h:
        job = await h.job(
            "with failures",
            [
                {"model": "demo-chat-api", "params": {"prompt": "fine 1"}},
                {"model": "demo-chat-api", "params": {"prompt": "refused [status=400]"}},
                {"model": "demo-chat-api", "params": {"prompt": "fine 2"}},
            ],
        )
        done = await h.wait_job(job["id"])
        assert done["state"] == "partial"
        failed = [t for t in done["tasks"] if t["state"] == "failed"]
        assert len(failed) == 1 and failed[0]["attempt"] == 1  # permanent: no automatic retry
        assert failed[0]["error"]["kind"]
        succeeded = {t["id"]: t["finished_at"] for t in done["tasks"] if t["state"] == "success"}

        retried = (await h.http.post(f"/v1/jobs/{job['id']}/retry")).json()
        states = {t["id"]: t["state"] for t in retried["tasks"]}
        assert states[failed[0]["id"]] == "pending"
        again = await h.wait_job(job["id"])
        for task in again["tasks"]:
            if task["id"] in succeeded:  # never re-run
                assert task["finished_at"] == succeeded[task["id"]] and task["attempt"] == 1
        (refailed,) = [t for t in again["tasks"] if t["state"] == "failed"]
        assert refailed["id"] == failed[0]["id"] and refailed["attempt"] == 2
        single = (await h.http.post(f"/v1/tasks/{refailed['id']}/retry")).json()
        assert single["state"] == "pending" and single["attempt"] == 3


async def test_transient_failures_are_retried_until_attempts_run_out(tmp_path: Path) -> None:
    async with running_service(tmp_path) as h:
        task = await h.submit("demo-video", "always breaks [fail=transient]", gen_s=1)
        done = await h.wait_task(task["id"])
        assert done["state"] == "failed"
        assert done["attempt"] == done["max_attempts"] == 3


async def test_cancel_job_cancels_pending_and_running(tmp_path: Path) -> None:
    async with running_service(tmp_path, concurrency={"demo": 2}) as h:
        job = await h.job(
            "to cancel",
            [
                {"model": "demo-video", "params": {"prompt": f"slow {i}", "gen_s": 500}}
                for i in range(5)
            ],
        )
        await h.wait_task(job["tasks"][0]["id"], {"running"})
        response = await h.http.post(f"/v1/jobs/{job['id']}/cancel")
        assert response.status_code == 200
        done = await h.wait_job(job["id"])
        assert done["state"] == "canceled" and done["counts"]["canceled"] == 5


async def test_disabled_provider_starts_nothing_and_switch_persists(tmp_path: Path) -> None:
    state = tmp_path / "state"
    async with running_service(tmp_path, state_dir=state, concurrency={"demo": 1}) as h:
        running = await h.submit("demo-video", "already running", gen_s=30)
        await h.wait_task(running["id"], {"running"})
        response = await h.http.post(
            "/v1/accounts/demo/disable", json={"reason": "quota exhausted"}
        )
        assert response.json()["enabled"] is False
        waiting = await h.submit("demo-chat-api", "must wait")
        # The running task finishes; the queued one does not start while disabled.
        assert (await h.wait_task(running["id"]))["state"] == "success"
        await asyncio.sleep(0.3)
        assert (await h.task(waiting["id"]))["state"] == "pending"
        lanes = {lane["name"]: lane for lane in (await h.http.get("/v1/lanes")).json()}
        assert lanes["api:demo"]["enabled"] is False and lanes["api:demo"]["queued"] == 1
        bad = await h.http.post("/v1/accounts/demo/disable", json={"reason": "  "})
        assert bad.status_code == 400
        assert (await h.http.post("/v1/accounts/nobody/enable")).status_code == 404
    async with running_service(tmp_path, state_dir=state) as h:
        accounts = {a["name"]: a for a in (await h.http.get("/v1/accounts")).json()}
        assert (
            accounts["demo"]["enabled"] is False and accounts["demo"]["reason"] == "quota exhausted"
        )
        assert (await h.task(waiting["id"]))["state"] == "pending"
        await h.http.post("/v1/accounts/demo/enable")
        assert (await h.wait_task(waiting["id"]))["state"] == "success"


async def test_events_stream_reports_state_changes(tmp_path: Path) -> None:
    async with running_service(tmp_path) as h:
        seen: list[str] = []

        async def listen() -> None:
            async with h.http.stream("GET", "/v1/events") as stream:
                async for line in stream.aiter_lines():
                    if line.startswith("data:") and '"success"' in line:
                        seen.append(line)
                        return

        listener = asyncio.create_task(listen())
        await asyncio.sleep(0.1)
        task = await h.submit("demo-chat-api", "stream me")
        await asyncio.wait_for(listener, timeout=20)
        assert task["id"] in seen[0]
