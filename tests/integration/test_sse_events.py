"""`GET /v1/events` as a client reads it: each kind's SSE name and JSON keys."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from tests.support.harness import running_service

TASK_KEYS = {
    "id", "job_id", "ref", "model", "kind", "owner", "params", "fingerprint", "state",
    "stage", "attempt", "max_attempts", "cancel_requested", "force", "remote_id", "result",
    "error", "from_cache", "created_at", "started_at", "heartbeat_at", "finished_at",
    "stage_durations", "cost_estimate_usd", "cost_usd", "priority", "deadline", "deadline_action",
    "fallbacks", "skipped", "late",
}  # fmt: skip
ACCOUNT_KEYS = {
    "name", "kind", "enabled", "reason", "needs_attention", "updated_at", "state", "until", "since",
}  # fmt: skip


async def test_each_event_kind_reaches_an_sse_client_in_its_pinned_shape(tmp_path: Path) -> None:
    async with running_service(tmp_path) as h:
        frames: dict[str, list[dict[str, Any]]] = {}
        opened = asyncio.Event()

        async def listen() -> None:
            name = ""
            async with h.http.stream("GET", "/v1/events") as stream:
                opened.set()
                async for line in stream.aiter_lines():
                    if line.startswith("event: "):
                        name = line.removeprefix("event: ")
                    elif line.startswith("data: "):
                        frames.setdefault(name, []).append(json.loads(line[6:]))
                        if {"task", "account", "reload"} <= frames.keys():
                            return

        listener = asyncio.create_task(listen())
        await asyncio.wait_for(opened.wait(), 10)
        task = await h.submit("demo-chat-api", "stream me")
        await h.http.post("/v1/accounts/demo/disable", json={"reason": "pinning"})
        reload = (await h.http.post("/v1/reload")).json()
        await asyncio.wait_for(listener, timeout=20)

    (new, *_) = frames["task"]
    assert new.keys() == {"type", "task"} and new["type"] == "task"
    assert new["task"].keys() == TASK_KEYS and new["task"]["id"] == task["id"]
    (switched, *_) = frames["account"]
    assert switched.keys() == {"type", "account", "previous"} and switched["previous"] == "ok"
    assert switched["account"].keys() == ACCOUNT_KEYS
    assert switched["account"]["name"] == "demo" and switched["account"]["state"] == "disabled"
    assert frames["reload"] == [{"type": "reload", **reload}]
