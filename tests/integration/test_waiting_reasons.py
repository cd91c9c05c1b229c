"""Tasks that cannot run say why instead of showing an ETA (issue 26 #13)."""

from __future__ import annotations

from pathlib import Path

from tests.support.harness import running_service


async def test_a_task_whose_lane_is_disabled_has_a_reason_not_an_eta(tmp_path: Path) -> None:
    async with running_service(tmp_path) as h:
        # One run first: with a run time known, the old answer made up an ETA.
        done = await h.submit("demo-video", "a first clip", gen_s=1)
        assert (await h.wait_task(done["id"]))["state"] == "success"
        answer = await h.http.post("/v1/accounts/demo/disable", json={"reason": "quota used up"})
        assert answer.status_code == 200, answer.text
        job = await h.job(
            "held", [{"model": "demo-video", "params": {"prompt": "waits", "gen_s": 1}}]
        )
        task = await h.task(job["tasks"][0]["id"])
        assert task["state"] == "pending"
        assert task["eta_s"] is None
        assert task["waiting"] == "cannot run: lane api:demo is disabled (quota used up)"
        light = (await h.http.get(f"/v1/jobs/{job['id']}?tasks=none")).json()
        assert light["eta_s"] is None and light["waiting"] == task["waiting"]

        # Switched back on, the estimate returns and the reason goes.
        assert (await h.http.post("/v1/accounts/demo/enable")).status_code == 200
        task = await h.task(task["id"])
        if task["state"] == "pending":
            assert task["eta_s"] is not None and "waiting" not in task
        assert (await h.wait_task(task["id"]))["state"] == "success"
