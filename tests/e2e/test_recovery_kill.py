"""kill -9 the real service at several points; nothing is lost, nothing is submitted twice."""

from __future__ import annotations

import random
import time
from pathlib import Path

import httpx
import pytest

from tests.support.procs import demo_stats, service_client, start_service, stop_proc, vendor_and_env

TIME_SCALE = 0.1
KILLS = 5


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_kill_9_at_several_points_loses_nothing(tmp_path: Path) -> None:
    vendor, vendor_url, env = vendor_and_env(
        tmp_path, ("demo-chat-api", "demo-video", "demo-queue"), TIME_SCALE
    )
    state = tmp_path / "state"
    log = tmp_path / "service.log"
    rng = random.Random(7)
    tasks = (
        [
            {"model": "demo-video", "params": {"prompt": f"clip {i}", "gen_s": rng.uniform(30, 60)}}
            for i in range(20)
        ]
        + [
            {
                "model": "demo-queue",
                "params": {"prompt": f"image {i}", "gen_s": rng.uniform(20, 50)},
            }
            for i in range(10)
        ]
        + [
            {
                "model": "demo-chat-api",
                "params": {"prompt": f"line {i}", "gen_s": rng.uniform(2, 8)},
            }
            for i in range(6)
        ]
    )
    service = None
    try:
        service = start_service(state, env, log)
        with service_client(state) as client:
            job = client.post("/v1/jobs", json={"name": "crash me", "tasks": tasks}).json()
        kill_delays_s = [0.4, 0.9, 0.6, 1.3, 0.8][:KILLS]
        seen_running_with_remote = 0
        for round_index, delay_s in enumerate(kill_delays_s):
            if round_index == 2:
                # Hold the next submissions at the vendor so this kill lands
                # mid-submit: the job may exist remotely with no id stored here.
                httpx.post(
                    f"{vendor_url}/__mode",
                    json={"mode": "slow", "only": "submit", "count": 6, "delay_s": 40},
                ).raise_for_status()
            time.sleep(delay_s)
            with service_client(state) as client:
                snapshot = client.get(f"/v1/jobs/{job['id']}").json()
            seen_running_with_remote += sum(
                1 for t in snapshot["tasks"] if t["state"] == "running" and t["remote_id"]
            )
            assert snapshot["state"] == "running", "the job finished before every kill landed"
            service.kill9()
            service = start_service(state, env, log)
        deadline = time.monotonic() + 120
        with service_client(state) as client:
            while True:
                final = client.get(f"/v1/jobs/{job['id']}").json()
                if final["state"] != "running" or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
        assert service.terminate() == 0
    finally:
        if service is not None:
            stop_proc(service.popen)
        stats = demo_stats(vendor_url)
        stop_proc(vendor)
    assert final["total"] == len(tasks), "a task was lost"
    assert final["counts"]["success"] == len(tasks), final["counts"]
    # Kills landed while jobs were in flight at the vendor, so recovery had
    # real remote jobs to resume, not just a queue to restart.
    assert seen_running_with_remote > 0
    async_tasks = sum(1 for t in tasks if t["model"] != "demo-chat-api")
    # Every async task made exactly one remote job, whatever the kills.
    assert stats["jobs_created"] == async_tasks, stats
    assert "start-up reconciliation:" in service.log()
    resumed = [line for line in service.log().splitlines() if "start-up reconciliation" in line]
    assert len(resumed) == KILLS + 1
    assert any(" 0 resumed" not in line for line in resumed[1:]), "no kill hit a polling task"
    assert any(" 0 re-queued" not in line for line in resumed[1:]), "no kill hit a submit"
