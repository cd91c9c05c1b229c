"""After the run, over HTTP: attempt history, id prefixes, paged listings, liveness."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from dispatcher.models import Kind, State, Task
from tests.support.harness import Harness, running_service


async def _pages(h: Harness, path: str, limit: int) -> list[list[dict[str, Any]]]:
    """Every page of a listing, following `next` until it is null."""
    pages = []
    after = ""
    while True:
        separator = "&" if "?" in path else "?"
        response = await h.http.get(f"{path}{separator}limit={limit}&after={after}")
        assert response.status_code == 200, response.text
        page = response.json()
        pages.append(page["items"])
        if page["next"] is None:
            return pages
        after = page["next"]


async def test_a_task_answer_carries_every_attempt_of_it(tmp_path: Path) -> None:
    async with running_service(tmp_path, concurrency={"demo": 2}) as h:
        broken = await h.submit("demo-video", "always breaks [fail=transient]", gen_s=1)
        fine = await h.submit("demo-video", "works at once", gen_s=1)
        long = await h.submit("demo-video", "canceled midway", gen_s=400)
        await h.wait_task(long["id"], {"running"})
        await h.http.post(f"/v1/tasks/{long['id'][:6]}/cancel")

        failed = await h.wait_task(broken["id"])
        attempts = failed["attempts"]
        assert [a["attempt"] for a in attempts] == [1, 2, 3]
        # Two attempts went back to the queue, the last one ended the task.
        assert [a["outcome"] for a in attempts] == ["pending", "pending", "failed"]
        for attempt in attempts:
            assert attempt["owner"] == "demo" and attempt["lane"] == "api:demo"
            assert "account" not in attempt  # the old name of "owner" went in 0.2
            assert attempt["error"]["kind"] and attempt["error"]["message"]
            assert attempt["started_at"] <= attempt["ended_at"]
            assert "dispatched" in attempt["stage_durations"]
        assert attempts[0]["ended_at"] <= attempts[1]["started_at"]

        done = await h.wait_task(fine["id"])
        (only,) = done["attempts"]
        assert only["outcome"] == "success" and only["error"] is None
        assert done["owner"] == "demo" and "account" not in done
        assert set(only["stage_durations"]) >= {"dispatched", "generating", "downloading"}

        canceled = await h.wait_task(long["id"])
        assert canceled["state"] == "canceled"
        assert [a["outcome"] for a in canceled["attempts"]] == ["canceled"]

        # Lists stay light: the history is in the single task's answer only.
        listed = (await h.http.get("/v1/tasks")).json()["items"]
        assert len(listed) == 3 and all("attempts" not in task for task in listed)


async def test_ids_resolve_from_a_unique_prefix_and_an_ambiguous_one_lists_candidates(
    tmp_path: Path,
) -> None:
    async with running_service(tmp_path) as h:
        twins = [
            Task(
                id=f"abcd{n}" + "0" * 27,
                model="demo-chat-api",
                kind=Kind.API,
                queue="api:demo",
                params={"prompt": f"twin {n}"},
                fingerprint=f"twin-{n}",
                created_at=1.0,
                state=State.SUCCESS,
                result={"text": f"answer {n}", "files": []},
            )
            for n in (1, 2)
        ]
        await h.service.store.insert_tasks(twins)
        ambiguous = await h.http.get("/v1/tasks/abcd")
        assert ambiguous.status_code == 409
        error = ambiguous.json()["error"]
        assert error["kind"] == "ambiguous"
        assert error["candidates"] == [t.id for t in twins]
        assert twins[0].id in error["message"] and twins[1].id in error["message"]

        one = await h.http.get("/v1/tasks/abcd2")
        assert one.status_code == 200 and one.json()["id"] == twins[1].id
        text = await h.http.get("/v1/tasks/abcd1/result")
        assert text.json() == {"text": "answer 1"}
        too_short = await h.http.get("/v1/tasks/abc")
        assert too_short.status_code == 404 and "4+ characters" in too_short.text

        job = await h.job(
            "prefixed", [{"model": "demo-video", "params": {"prompt": "x", "gen_s": 300}}]
        )
        by_prefix = await h.http.get(f"/v1/jobs/{job['id'][:5]}")
        assert by_prefix.status_code == 200 and by_prefix.json()["id"] == job["id"]
        canceled = await h.http.post(f"/v1/jobs/{job['id'][:5]}/cancel")
        assert canceled.status_code == 200 and canceled.json()["id"] == job["id"]
        assert (await h.wait_job(job["id"]))["state"] == "canceled"


async def test_listings_page_newest_first_with_filters(tmp_path: Path) -> None:
    async with running_service(tmp_path) as h:
        singles = [await h.submit("demo-chat-api", f"single {n}", gen_s=1) for n in range(3)]
        job = await h.job(
            "stills",
            [
                {"model": "demo-queue", "ref": f"still-{n}", "params": {"prompt": f"s{n}"}}
                for n in range(4)
            ],
        )
        other = await h.job("chat", [{"model": "demo-chat-api", "params": {"prompt": "hi"}}])
        await h.wait_job(job["id"])
        await h.wait_job(other["id"])

        pages = await _pages(h, "/v1/tasks", limit=3)
        assert [len(page) for page in pages] == [3, 3, 2]
        ids = [task["id"] for page in pages for task in page]
        job_ids = [t["id"] for t in (await h.http.get(f"/v1/jobs/{job['id']}")).json()["tasks"]]
        expected = [
            other["tasks"][0]["id"],
            *reversed(job_ids),
            *(s["id"] for s in reversed(singles)),
        ]
        assert ids == expected

        mine = (await h.http.get(f"/v1/tasks?job={job['id'][:8]}&limit=2")).json()
        assert [t["ref"] for t in mine["items"]] == ["still-3", "still-2"] and mine["next"]
        by_model = (await h.http.get("/v1/tasks?model=demo-chat-api")).json()["items"]
        assert len(by_model) == 4 and all(t["model"] == "demo-chat-api" for t in by_model)
        by_text = (await h.http.get("/v1/tasks?q=still-1")).json()["items"]
        assert [t["ref"] for t in by_text] == ["still-1"]
        by_prompt = (await h.http.get("/v1/tasks?q=single 2")).json()["items"]
        assert [t["id"] for t in by_prompt] == [singles[2]["id"]]
        assert (await h.http.get("/v1/tasks?state=pending,running")).json()["items"] == []

        jobs = await _pages(h, "/v1/jobs", limit=1)
        assert [page[0]["name"] for page in jobs] == ["chat", "stills"]
        stills = jobs[1][0]
        assert stills["counts"]["success"] == 4 and stills["state"] == "success"
        assert stills["finished_at"] >= stills["created_at"] and stills["elapsed_s"] >= 0
        named = (await h.http.get("/v1/jobs?q=stil&state=success,partial")).json()["items"]
        assert [j["id"] for j in named] == [job["id"]]
        assert (await h.http.get("/v1/jobs?state=failed")).json() == {"items": [], "next": None}

        for bad in (
            "/v1/tasks?state=bogus",
            "/v1/tasks?limit=0",
            "/v1/tasks?after=x",
            "/v1/jobs?state=pending",
            "/v1/tasks?job=nope",
        ):
            response = await h.http.get(bad)
            assert response.status_code in (400, 404), (bad, response.text)
            assert response.json()["error"]["message"]


async def test_refs_are_checked_and_a_repeat_job_says_it_came_from_the_cache(
    tmp_path: Path,
) -> None:
    async with running_service(tmp_path) as h:
        tasks = [
            {"model": "demo-chat-api", "ref": "line-a", "params": {"prompt": "a", "gen_s": 1}},
            {"model": "demo-chat-api", "ref": "line-b", "params": {"prompt": "b", "gen_s": 1}},
        ]
        duplicate = await h.http.post(
            "/v1/jobs", json={"name": "dup", "tasks": [tasks[0], {**tasks[1], "ref": "line-a"}]}
        )
        assert duplicate.status_code == 400
        assert "tasks[1]: ref 'line-a' is already used by tasks[0]" in duplicate.text
        bad = await h.http.post("/v1/tasks", json={**tasks[0], "ref": "../etc"})
        assert bad.status_code == 400 and "ref must be" in bad.text
        assert (await h.http.get("/v1/jobs")).json()["items"] == []

        first = await h.wait_job((await h.job("first", tasks))["id"])
        assert first["state"] == "success" and first["from_cache"] == 0
        again = await h.job("again", tasks)
        assert again["state"] == "success" and again["from_cache"] == 2
        assert [t["ref"] for t in again["tasks"]] == ["line-a", "line-b"]
        assert all(t["attempts"] == [] for t in [await h.task(t["id"]) for t in again["tasks"]])


async def test_livez_answers_without_a_token_and_shows_nothing(tmp_path: Path) -> None:
    async with running_service(tmp_path) as h, httpx.AsyncClient(base_url=h.service.url) as anon:
        live = await anon.get("/livez")
        assert live.status_code == 200 and live.json() == {"ok": True}
        assert (await anon.head("/livez")).status_code == 200
        assert (await anon.post("/livez")).status_code == 405
        assert (await anon.get("/healthz")).status_code == 401
        assert (await anon.get("/v1/tasks")).status_code == 401
        paths = (await h.http.get("/openapi.json")).json()["paths"]
        assert {"/livez", "/v1/webhooks/deliveries"} <= set(paths)
