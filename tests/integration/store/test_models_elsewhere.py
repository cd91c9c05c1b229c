"""A host accepts a task for a model only another live host runs.

Two services on one fresh PostgreSQL database: host A loads the chat
model only, host B the video model only. A submit (and a job) of the video
model on A is accepted and run by B; the same request on B within the
de-duplication window is the same task (A built the fingerprint as B
would). Once B has stopped, A refuses the model again, naming what it
knows.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.harness import host_service
from tests.support.pgdb import migrated_database

pytestmark = pytest.mark.timeout(120)

SCALE = 0.2


async def test_a_host_accepts_a_model_another_host_runs_until_that_host_stops(
    tmp_path: Path,
) -> None:
    with migrated_database() as url:
        async with host_service(tmp_path, "host-a", ("demo-chat-api",), url, SCALE) as a:
            b_service = host_service(tmp_path, "host-b", ("demo-video",), url, SCALE)
            b = await b_service.__aenter__()
            try:
                clip = await a.submit("demo-video", "a clip asked on A", gen_s=1)
                assert not clip["deduped"]
                same = await b.submit("demo-video", "a clip asked on A", gen_s=1)
                assert same["deduped"] and same["id"] == clip["id"]
                done = await a.wait_task(clip["id"])
                assert done["state"] == "success", done
                assert done["host"] == "host-b" and done["result"]["files"]

                job = await a.job(
                    "mixed",
                    [
                        {"model": "demo-chat-api", "params": {"prompt": "hi", "gen_s": 1}},
                        {"model": "demo-video", "params": {"prompt": "a pan", "gen_s": 1}},
                    ],
                )
                finished = await a.wait_job(job["id"])
                assert finished["state"] == "success", finished
                hosts = {t["model"]: t["host"] for t in finished["tasks"]}
                assert hosts == {"demo-chat-api": "host-a", "demo-video": "host-b"}
            finally:
                await b_service.__aexit__(None, None, None)

            # B signed off (nothing left running): nobody runs the model now.
            refused = await a.http.post(
                "/v1/tasks", json={"model": "demo-video", "params": {"prompt": "late"}}
            )
            assert refused.status_code == 400, refused.text
            assert "unknown model 'demo-video'" in refused.json()["error"]["message"]
