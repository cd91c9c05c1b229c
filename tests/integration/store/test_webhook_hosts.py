"""Two services on one PostgreSQL database share one webhook outbox.

Host A runs the chat model's jobs, host B the video model's; both post to
one receiver. While the receiver is down, A's `job.finished` events wait
for their retries; A stops (gracefully, as at SIGTERM) and B delivers them.
Every event is answered 200 exactly once, whichever host sent it.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_webhooks import SECRET, Receiver, receiver
from tests.support.harness import Harness, running_service
from tests.support.pgdb import migrated_database

pytestmark = pytest.mark.timeout(120)

# Retries 1, 2, 4, 8 s apart: A's events are still waiting when it stops.
SCALE = 0.5


def _answered_ok(hook: Receiver) -> Counter[str]:
    return Counter(
        r["headers"]["x-dispatcher-delivery"] for r in hook.received if r["status"] == 200
    )


async def _job(h: Harness, name: str, model: str) -> str:
    job = await h.job(name, [{"model": model, "params": {"prompt": name, "gen_s": 1}}])
    done = await h.wait_job(job["id"], timeout_s=60)
    assert done["state"] == "success"
    return str(job["id"])


async def test_hosts_share_the_outbox_and_deliver_each_event_once(tmp_path: Path) -> None:
    with migrated_database() as url:
        async with receiver() as hook, AsyncExitStack() as b_stack:
            hook.down = True
            settings: dict[str, Any] = {
                "time_scale": SCALE,
                "database_url": url,
                "webhook_urls": [hook.url],
                "webhook_secret": SECRET,
            }
            (tmp_path / "b").mkdir()
            b = await b_stack.enter_async_context(
                running_service(
                    tmp_path / "b", profiles=("demo-video",), host_id="host-b", **settings
                )
            )
            (tmp_path / "a").mkdir()
            async with running_service(
                tmp_path / "a", profiles=("demo-chat-api",), host_id="host-a", **settings
            ) as a:
                a_jobs = [await _job(a, f"on a {n}", "demo-chat-api") for n in range(2)]
                deadline = asyncio.get_running_loop().time() + 30
                while {e["job"]["id"] for e in hook.events("job.finished")} != set(a_jobs):
                    assert asyncio.get_running_loop().time() < deadline, hook.received
                    await asyncio.sleep(0.02)
            # job id -> event id
            told_by_a = {e["job"]["id"]: e["id"] for e in hook.events("job.finished")}
            assert sorted(told_by_a) == sorted(a_jobs) and not _answered_ok(hook)

            hook.down = False
            b_job = await _job(b, "on b", "demo-video")
            deadline = asyncio.get_running_loop().time() + 60
            while len(_answered_ok(hook)) < 3:
                assert asyncio.get_running_loop().time() < deadline, hook.received
                await asyncio.sleep(0.05)
            delivered = _answered_ok(hook)
            assert set(told_by_a.values()) < set(delivered)  # A's events, sent by B
            assert set(delivered.values()) == {1}, delivered
            jobs_told = {e["job"]["id"] for e in hook.events("job.finished")}
            assert jobs_told == {*a_jobs, b_job}
            view = (await b.http.get("/v1/webhooks/deliveries")).json()
            assert (view["queued"], view["failed"], view["dropped"]) == (0, 0, 0)
