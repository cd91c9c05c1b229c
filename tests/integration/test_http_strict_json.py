"""Strict JSON at the door, and answers that survive whatever a row holds."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tests.support.harness import Harness, running_service
from tests.support.pgdb import migrated_database


def strict(text: str) -> Any:
    """Parse as a strict client would: no NaN/Infinity, no lone surrogates."""

    def refuse(name: str) -> Any:
        raise AssertionError(f"{name} in an answer")

    value = json.loads(text, parse_constant=refuse)
    json.dumps(value, ensure_ascii=False).encode("utf-8")  # lone surrogates fail here
    return value


DEEP = "[" * 10_000 + "]" * 10_000
BAD_BODIES = [
    ('{"model": "demo-chat-api", "params": {"prompt": "x", "x": NaN}}', "NaN"),
    ('{"model": "demo-chat-api", "params": {"prompt": "x", "x": Infinity}}', "Infinity"),
    ('{"model": "demo-chat-api", "params": {"prompt": "x", "x": -Infinity}}', "Infinity"),
    ('{"model": "demo-chat-api", "params": {"prompt": "x", "x": 1e999}}', "finite"),
    ('{"model": "demo-chat-api", "params": {"prompt": "a\\ud800b"}}', "surrogate"),
    ('{"model": "demo-chat-api", "params": {"prompt": "x", "\\udfff": 1}}', "surrogate"),
    ('{"model": "demo-chat-api", "params": {"prompt": "x", "d": ' + DEEP + "}}", "64 levels"),
    ('{"model": "demo-chat-api", "params": {"prompt": "x", "n": ' + "9" * 4000 + "}}", "64 bits"),
]


@pytest.mark.parametrize(("body", "fragment"), BAD_BODIES)
async def test_non_strict_json_is_refused_at_the_door(
    tmp_path: Path, body: str, fragment: str
) -> None:
    async with running_service(tmp_path) as h:
        headers = {"Content-Type": "application/json"}
        response = await h.http.post("/v1/tasks", content=body.encode(), headers=headers)
        assert response.status_code == 400, response.text
        assert fragment in response.json()["error"]["message"]
        job = ('{"name": "j", "tasks": [' + body + "]}").encode()
        response = await h.http.post("/v1/jobs", content=job, headers=headers)
        assert response.status_code == 400, response.text
        assert fragment in response.json()["error"]["message"]
        assert await h.service.store.state_counts() == {}


async def test_lone_surrogate_in_a_job_name_is_refused(tmp_path: Path) -> None:
    async with running_service(tmp_path) as h:
        body = b'{"name": "\\ud800", "tasks": [{"model": "demo-chat-api", "params": {}}]}'
        response = await h.http.post("/v1/jobs", content=body)
        assert response.status_code == 400
        assert "surrogate" in response.json()["error"]["message"]
        assert (await h.http.get("/v1/jobs")).json()["items"] == []


async def _corrupt(h: Harness, task_id: str, **columns: str) -> None:
    """Write a row the way an older version (or a bad disk) could have left it."""
    sets = ", ".join(f"{name} = ?" for name in columns)

    def write() -> None:
        with sqlite3.connect(h.state_dir / "dispatcher.db") as db:
            db.execute(f"UPDATE tasks SET {sets} WHERE id = ?", [*columns.values(), task_id])

    await asyncio.to_thread(write)


async def test_rows_with_bad_json_still_list_and_answer(tmp_path: Path) -> None:
    async with running_service(tmp_path) as h:
        job = await h.job(
            "old rows",
            [
                {"model": "demo-chat-api", "params": {"prompt": "fine"}},
                {"model": "demo-chat-api", "params": {"prompt": "[fail=permanent] no"}},
                {"model": "demo-chat-api", "params": {"prompt": "deep"}},
            ],
        )
        await h.wait_job(job["id"])
        ok, failed, deep = (t["id"] for t in job["tasks"])
        # Lenient-JSON values (NaN, a lone surrogate escape), then text that is
        # no JSON at all, then nesting past the interpreter's recursion limit.
        await _corrupt(
            h,
            ok,
            params='{"prompt": "x\\ud800", "seed": NaN, "t": Infinity}',
            result='{"text": "broken',
        )
        await _corrupt(h, failed, params='{"prompt": ', stage_durations="nope")
        await _corrupt(h, deep, params=DEEP, result="[" * 100_000, stage="from-the-future")

        for path in (
            "/v1/tasks?state=success,failed",
            f"/v1/tasks/{ok}",
            f"/v1/tasks/{deep}",
            f"/v1/jobs/{job['id']}",
            "/v1/jobs",
        ):
            response = await h.http.get(path)
            assert response.status_code == 200, (path, response.text)
            strict(response.text)
        listed = strict((await h.http.get("/v1/tasks?state=success,failed")).text)["items"]
        assert {t["id"] for t in listed} == {ok, failed, deep}
        shown = strict((await h.http.get(f"/v1/tasks/{ok}")).text)
        assert shown["params"]["seed"] is None  # NaN cannot be JSON; it is shown as null

        async def first_event() -> str:
            async with h.http.stream("GET", "/v1/events") as stream:
                async for line in stream.aiter_lines():
                    if line.startswith("data:") and failed in line:
                        return line.removeprefix("data:")
            raise AssertionError("stream ended")

        listener = asyncio.create_task(first_event())
        await asyncio.sleep(0.1)
        await _corrupt(h, failed, params='{"prompt": "again", "x": NaN}')
        response = await h.http.post(f"/v1/tasks/{failed}/retry")
        assert response.status_code == 200, response.text
        assert strict(response.text)["params"]["x"] is None
        event = strict(await asyncio.wait_for(listener, timeout=10))
        assert event["task"]["id"] == failed


@pytest.mark.parametrize("dialect", ["sqlite", "postgresql"])
async def test_a_nul_from_a_client_is_a_4xx_on_both_stores(tmp_path: Path, dialect: str) -> None:
    # PostgreSQL refuses a NUL in text: each of these used to answer 500 there.
    with contextlib.ExitStack() as stack:
        extra: dict[str, Any] = {}
        if dialect == "postgresql":
            extra = {
                "database_url": stack.enter_context(migrated_database()),
                "host_id": "nul-host",
            }
        async with running_service(tmp_path, **extra) as h:
            account = (await h.http.get("/v1/accounts")).json()[0]["name"]
            task = {"model": "demo-chat-api", "params": {"prompt": "a\u0000b"}}
            sent = [
                await h.http.post("/v1/tasks", json=task),
                await h.http.post("/v1/jobs", json={"name": "j\u0000", "tasks": [task]}),
                await h.http.post(f"/v1/accounts/{account}/disable", json={"reason": "x\u0000"}),
                await h.http.get("/v1/tasks", params={"q": "\u0000"}),
                await h.http.get("/v1/tasks", params={"job": "\u0000"}),
                await h.http.get("/v1/jobs", params={"q": "a\u0000"}),
            ]
            for response in sent:
                assert response.status_code == 400, (response.request.url, response.text)
                assert "NUL" in response.json()["error"]["message"]
            # In a path it names nothing: the documented answer for an unknown id.
            for path in ("/v1/tasks/%00", "/v1/jobs/a%00b", "/v1/tasks/%00/result"):
                response = await h.http.get(path)
                assert response.status_code == 404, (path, response.text)
                assert "NUL" in response.json()["error"]["message"]
            assert await h.service.store.state_counts() == {}
            assert all(a["enabled"] for a in (await h.http.get("/v1/accounts")).json())
