"""The demo provider itself behaves like a real vendor."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tests.integration.apirunner.conftest import Demo

AUTH = {"Authorization": "Bearer k1"}


async def test_it_wants_an_api_key(demo: Demo) -> None:
    answer = await demo.http.post(f"{demo.url}/v1/videos", json={"prompt": "x"})
    assert answer.status_code == 401
    assert answer.json()["error"]["code"] == "invalid_api_key"
    stats = await demo.stats()
    assert {"submits", "polls", "max_concurrent", "early_requests", "duplicate_submits"} <= set(
        stats
    )
    assert {"cancels", "requests"} <= set(stats)
    assert (stats["requests"], stats["unauthorized"]) == (1, 1)


async def test_the_quota_answers_429_with_retry_after_and_counts_early_requests(
    demo: Demo,
) -> None:
    for i in range(3):
        answer = await demo.http.post(
            f"{demo.url}/v1/videos", json={"prompt": f"p{i}", "gen_s": 100}, headers=AUTH
        )
        assert answer.status_code == 200
    refused = await demo.http.post(
        f"{demo.url}/v1/videos", json={"prompt": "p3", "gen_s": 100}, headers=AUTH
    )
    assert refused.status_code == 429
    assert float(refused.headers["retry-after-ms"]) > 0
    assert int(refused.headers["Retry-After"]) >= 1
    # Another vendor on the same server keeps its own quota.
    fal = await demo.http.post(f"{demo.url}/fal/x/y", json={"prompt": "f"}, headers=AUTH)
    assert fal.status_code == 200
    await asyncio.sleep(0.6)  # past the grace for requests already on the wire
    await demo.http.get(f"{demo.url}/v1/videos/{answer.json()['id']}", headers=AUTH)
    stats = await demo.stats()
    assert stats["max_concurrent"] == 3
    assert stats["early_requests"] == 1
    assert stats["rate_limited"] == 1


async def test_idempotency_keys_return_the_same_job(demo: Demo) -> None:
    headers = {**AUTH, "Idempotency-Key": "t1-1"}
    first = await demo.http.post(f"{demo.url}/v1/videos", json={"prompt": "a"}, headers=headers)
    again = await demo.http.post(f"{demo.url}/v1/videos", json={"prompt": "a"}, headers=headers)
    assert first.json()["id"] == again.json()["id"]
    stats = await demo.stats()
    assert (stats["jobs_created"], stats["duplicate_submits"]) == (1, 1)


async def test_modes_are_validated_and_reset_forgets_everything(demo: Demo) -> None:
    bad = await demo.http.post(f"{demo.url}/__mode", json={"mode": "explode"})
    assert bad.status_code == 400
    await demo.mode(mode="5xx", count=1, status=502)
    answer = await demo.http.get(f"{demo.url}/v1/videos/nope", headers=AUTH)
    assert answer.status_code == 502
    await demo.http.post(f"{demo.url}/__reset")
    assert (await demo.stats())["requests"] == 0
