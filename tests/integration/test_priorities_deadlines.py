"""Priorities and deadlines through the service (issue 30): a later urgent task
overtakes waiting ones, a task past its deadline is flagged late or canceled
as it asked."""

from __future__ import annotations

from pathlib import Path

from tests.support.harness import running_service


def _chat(prompt: str, **fields: object) -> dict[str, object]:
    return {"model": "demo-chat-api", "params": {"prompt": prompt, "gen_s": 1}, **fields}


async def test_priority_then_deadline_order_a_queue_and_late_tasks_are_flagged(
    tmp_path: Path,
) -> None:
    async with running_service(tmp_path, profiles=("demo-chat-api",), concurrency={"demo": 1}) as h:
        backlog = await h.job("backlog", [_chat(f"routine {i}") for i in range(4)])
        response = await h.http.post(
            "/v1/jobs",
            json={
                "name": "urgent",
                "priority": 5,
                "tasks": [
                    _chat("urgent, no deadline"),
                    _chat("urgent, due 2100", deadline="2100-01-01T00:00:00Z"),
                ],
            },
        )
        assert response.status_code == 201, response.text
        urgent_job = response.json()
        late = await h.job(
            "late",
            [
                _chat("late but run", deadline=1.0),
                _chat("late, cancel it", deadline=1.0, deadline_action="cancel"),
            ],
        )
        done = await h.wait_job(backlog["id"])
        await h.wait_job(urgent_job["id"])
        await h.wait_job(late["id"])
        order = sorted(
            [*done["tasks"], *(await h.wait_job(urgent_job["id"]))["tasks"]],
            key=lambda t: t["started_at"],
        )
        prompts = [t["params"]["prompt"] for t in order]
        # The first routine task was already running; then the urgent job, earliest
        # deadline first, overtakes the three routine tasks still waiting.
        assert prompts[1:3] == ["urgent, due 2100", "urgent, no deadline"], prompts
        assert urgent_job["tasks"][0]["priority"] == 5
        late_job = await h.wait_job(late["id"])
        assert late_job["late"] == 1 and urgent_job["late"] == 0
        ran, canceled = late_job["tasks"]
        assert ran["state"] == "success" and ran["late"] is True
        assert canceled["state"] == "canceled" and canceled["late"] is False
        assert canceled["error"]["kind"] == "deadline"
        assert "too late to finish by its deadline" in canceled["error"]["message"]


async def test_a_fallback_runs_once_on_the_equivalent_model_whose_lane_is_free(
    tmp_path: Path,
) -> None:
    async with running_service(tmp_path, profiles=("demo-chat-api", "demo-queue")) as h:
        # The first choice's provider is off: the task waits in both queues and
        # runs on the other model, as that model's task.
        off = await h.http.post("/v1/accounts/demo/disable", json={"reason": "quota gone"})
        assert off.status_code == 200, off.text
        task = await h.submit("demo-chat-api", "either will do")
        assert task["fallbacks"] == []
        response = await h.http.post(
            "/v1/tasks",
            json={
                "model": "demo-chat-api",
                "models": ["demo-chat-api", "demo-queue"],
                "params": {"prompt": "a lighthouse, either way", "gen_s": 1},
            },
        )
        assert response.status_code == 201, response.text
        fallback = response.json()
        assert fallback["fallbacks"] == ["demo-queue"]
        done = await h.wait_task(fallback["id"])
        assert done["state"] == "success" and done["model"] == "demo-queue"
        assert done["owner"] == "demo-queue" and done["attempt"] == 1
        assert done["fingerprint"] != fallback["fingerprint"]
        # The plain task stays for its own model, saying why.
        plain = await h.task(task["id"])
        assert plain["state"] == "pending"
        assert plain["waiting"] == "cannot run: lane api:demo is disabled (quota gone)"
        attempts = (await h.task(fallback["id"]))["attempts"]
        assert [a["outcome"] for a in attempts] == ["success"]


async def test_a_fallback_runs_once_across_kinds_api_to_web(tmp_path: Path) -> None:
    async with running_service(tmp_path, profiles=("demo-chat-api", "demo-chat")) as h:
        off = await h.http.post("/v1/accounts/demo/disable", json={"reason": "quota gone"})
        assert off.status_code == 200, off.text
        response = await h.http.post(
            "/v1/tasks",
            json={
                "model": "demo-chat-api",
                "models": ["demo-chat-api", "demo-chat"],
                "params": {"prompt": "say hi from either side"},
            },
        )
        assert response.status_code == 201, response.text
        done = await h.wait_task(response.json()["id"], timeout_s=60)
        assert done["state"] == "success", done
        assert done["model"] == "demo-chat" and done["kind"] == "web"
        assert done["owner"] in ("demo-1", "demo-2") and done["attempt"] == 1
