"""A big job's light view and its paged tasks: small answers that leave the loop free."""

from __future__ import annotations

import asyncio
import io
import statistics
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from dispatcher import strictjson
from dispatcher.cli.progress import watch_job
from dispatcher.cli.service_client import Client
from dispatcher.tasks.spec import parse_job
from tests.support.harness import Harness, running_service

BIG_JOB = 10_000


async def big_job(h: Harness, size: int = BIG_JOB) -> str:
    """A job of `size` waiting tasks, written through the ledger (as POST /v1/jobs
    would, without sending megabytes of JSON through the test's client)."""
    tasks = [
        {"model": "demo-video", "ref": f"shot-{n:05d}", "params": {"prompt": f"p{n}", "gen_s": 400}}
        for n in range(size)
    ]
    name, specs = parse_job({"name": "big", "tasks": tasks})
    job, _ = await h.service.ledger.create_job(name, specs)
    return job.id


async def _timed_get(h: Harness, path: str) -> tuple[float, Any]:
    started = time.perf_counter()
    response = await h.http.get(path)
    assert response.status_code == 200, response.text
    return time.perf_counter() - started, response


async def test_a_10000_task_job_answers_small_and_leaves_livez_fast(tmp_path: Path) -> None:
    async with running_service(tmp_path, concurrency={"demo": 1}) as h:
        job_id = await big_job(h)
        livez = [(await _timed_get(h, "/livez"))[0] for _ in range(5)]
        baseline_s = statistics.median(livez)

        async def livez_during() -> float:
            await asyncio.sleep(0)  # let the job GET start first
            return (await _timed_get(h, "/livez"))[0]

        job_s, response = await _timed_get(h, f"/v1/jobs/{job_id}")
        (job_s2, _), during_s = await asyncio.gather(
            _timed_get(h, f"/v1/jobs/{job_id}"), livez_during()
        )
        job = response.json()
        size = len(response.content)
        print(
            f"\n10,000-task job GET: {size} bytes, {job_s * 1000:.0f} ms / {job_s2 * 1000:.0f} ms;"
            f" /livez {baseline_s * 1000:.1f} ms alone, {during_s * 1000:.1f} ms beside it"
        )
        # Before: every task in the answer, about 7 MB, 3-6 s of a held loop.
        assert size < 64 * 1024
        assert (
            job["total"] == BIG_JOB
            and job["counts"]["pending"] + job["counts"]["running"] == BIG_JOB
        )
        assert job["tasks_included"] is False and "tasks" not in job
        assert sum(job["by_model"]["demo-video"].values()) == BIG_JOB
        assert job["done"] == 0
        # Relative bounds: a light answer costs a few reads, like /livez, not thousands.
        assert job_s2 < max(1.0, 50 * baseline_s)
        assert during_s < max(1.0, 50 * baseline_s)


async def test_a_job_pages_its_tasks_in_job_order_by_state_and_ref(tmp_path: Path) -> None:
    async with running_service(tmp_path, concurrency={"demo": 1}) as h:
        job_id = await big_job(h, 1200)
        seen: list[str] = []
        cursor = ""
        while True:
            response = await h.http.get(f"/v1/jobs/{job_id}/tasks?limit=500&cursor={cursor}")
            assert response.status_code == 200, response.text
            page = response.json()
            assert len(page["items"]) <= 500
            seen += [t["ref"] for t in page["items"]]
            if page["next"] is None:
                break
            cursor = page["next"]
        assert seen == [f"shot-{n:05d}" for n in range(1200)]

        found = (await h.http.get(f"/v1/jobs/{job_id[:8]}/tasks?ref=shot-0111")).json()
        assert [t["ref"] for t in found["items"]] == [f"shot-0111{n}" for n in range(10)]
        waiting = (await h.http.get(f"/v1/jobs/{job_id}/tasks?state=pending&limit=3")).json()
        assert len(waiting["items"]) == 3 and {t["state"] for t in waiting["items"]} == {"pending"}
        assert (await h.http.get(f"/v1/jobs/{job_id}/tasks?state=success")).json() == {
            "items": [],
            "next": None,
        }
        # `?tasks=none` keeps even a small job's answer light; bad input is a 400.
        small = (await h.submit("demo-chat-api", "hi"))["id"]
        assert small
        light = (await h.http.get(f"/v1/jobs/{job_id}?tasks=none")).json()
        assert "tasks" not in light and light["total"] == 1200
        for bad in ("tasks?cursor=x", "tasks?limit=0", "tasks?state=nope", "?tasks=all"):
            answer = await h.http.get(f"/v1/jobs/{job_id}/{bad}".replace("/?", "?"))
            assert answer.status_code == 400, (bad, answer.text)
            assert answer.json()["error"]["message"]


async def test_a_small_job_still_carries_its_tasks(tmp_path: Path) -> None:
    async with running_service(tmp_path) as h:
        created = await h.job("small", [{"model": "demo-chat-api", "params": {"prompt": "a"}}])
        assert created["tasks_included"] is True and len(created["tasks"]) == 1
        job = await h.wait_job(created["id"])
        assert job["done"] == 1 and job["eta_s"] is None
        assert job["by_model"]["demo-chat-api"]["success"] == 1


class MeasuredClient(Client):
    """The CLI's client, noting how big each answer was."""

    def __init__(self, state_dir: Path) -> None:
        super().__init__(state_dir)
        self.sizes: list[int] = []

    def request(self, method: str, path: str, json: Any = None) -> Any:
        answer = super().request(method, path, json)
        self.sizes.append(len(strictjson.dump_bytes(answer)))
        return answer


async def test_the_batch_watcher_follows_a_10000_task_job_with_light_polls(
    tmp_path: Path,
) -> None:
    async with running_service(tmp_path, concurrency={"demo": 1}) as h:
        job_id = await big_job(h)
        client = MeasuredClient(h.state_dir)
        text = io.StringIO()
        out = Console(file=text, width=120)
        watching = asyncio.ensure_future(
            asyncio.to_thread(watch_job, client, job_id, out=out, interval_s=0.05)
        )
        deadline = asyncio.get_running_loop().time() + 60
        while len(client.sizes) < 4:  # a few polls of the running job
            assert asyncio.get_running_loop().time() < deadline and not watching.done()
            await asyncio.sleep(0.05)
        assert (await h.http.post(f"/v1/jobs/{job_id}/cancel")).status_code == 200
        job = await asyncio.wait_for(watching, timeout=120)
        print(f"\nwatcher: {len(client.sizes)} answers, the largest {max(client.sizes)} bytes")
        assert job["state"] == "canceled" and job["counts"]["canceled"] == BIG_JOB
        # Before: each poll carried every task, about 7 MB.
        assert max(client.sizes) < 64 * 1024
        assert f"progress {BIG_JOB}/{BIG_JOB}" in text.getvalue()
        assert "demo-video" in text.getvalue() or "api:demo" in text.getvalue()


async def test_a_new_job_answers_with_its_first_tasks_already_started(tmp_path: Path) -> None:
    # The answer (every task's view and ETA) is built after a round has
    # claimed what the quota allows: the first tasks do not wait for it.
    async with running_service(tmp_path, concurrency={"demo": 2}) as h:
        tasks = [
            {"model": "demo-video", "params": {"prompt": f"p{n}", "gen_s": 400}} for n in range(20)
        ]
        response = await h.http.post("/v1/jobs", json={"name": "first ones", "tasks": tasks})
        assert response.status_code == 201, response.text
        job = response.json()
        assert (job["counts"]["running"], job["counts"]["pending"]) == (2, 18)
        running = [t for t in job["tasks"] if t["state"] == "running"]
        assert [t["params"]["prompt"] for t in running] == ["p0", "p1"]
