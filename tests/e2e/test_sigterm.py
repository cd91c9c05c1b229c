"""SIGTERM stops the real service gracefully and leaves every task recoverable."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from dispatcher.models import State
from dispatcher.store.sqlite import SqliteStore
from tests.support.procs import demo_stats, service_client, start_service, stop_proc, vendor_and_env

TIME_SCALE = 0.05


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_sigterm_leaves_tasks_recoverable_and_restart_finishes_them(tmp_path: Path) -> None:
    vendor, vendor_url, env = vendor_and_env(tmp_path, ("demo-chat-api", "demo-video"), TIME_SCALE)
    state = tmp_path / "state"
    service = None
    try:
        service = start_service(state, env, tmp_path / "service.log")
        tasks = [
            {"model": "demo-video", "params": {"prompt": f"clip {i}", "gen_s": 60}}
            for i in range(5)
        ]
        with service_client(state) as client:
            job = client.post("/v1/jobs", json={"name": "term", "tasks": tasks}).json()
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                view = client.get(f"/v1/jobs/{job['id']}").json()
                if sum(1 for t in view["tasks"] if t["remote_id"]) == 3:
                    break
                time.sleep(0.05)
        started = time.monotonic()
        assert service.terminate(timeout_s=30) == 0
        assert time.monotonic() - started < 10, "graceful stop took too long"
        assert not (state / "port").exists()

        store = SqliteStore(state / "dispatcher.db")
        rows = await store.job_tasks(job["id"])
        await store.close()
        running = [t for t in rows if t.state is State.RUNNING]
        pending = [t for t in rows if t.state is State.PENDING]
        # Remote jobs keep going at the vendor: left running with their ids, to resume.
        assert len(running) == 3 and all(t.remote_id for t in running)
        assert len(pending) == 2 and all(t.attempt == 1 for t in pending)

        service = start_service(state, env, tmp_path / "service.log")
        with service_client(state) as client:
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline:
                view = client.get(f"/v1/jobs/{job['id']}").json()
                if view["state"] != "running":
                    break
                time.sleep(0.2)
        assert service.terminate() == 0
        assert view["state"] == "success", view["counts"]
        assert all(t["attempt"] == 1 for t in view["tasks"])
        assert demo_stats(vendor_url)["jobs_created"] == 5
    finally:
        if service is not None:
            stop_proc(service.popen)
        stop_proc(vendor)
