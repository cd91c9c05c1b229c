"""Many tasks on one quota-3 provider: the quota holds and Retry-After is obeyed."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from dispatcher.models import Task
from dispatcher.scheduling.protocol import RunResult

if TYPE_CHECKING:
    from tests.integration.apirunner.conftest import Kit

LANE = 3  # stands in for the scheduler's lane (the provider's quota)


async def run_in_lane(kit: Kit, tasks: list[Task], lane: int | None = LANE) -> list[RunResult]:
    gate = asyncio.Semaphore(lane) if lane else None

    async def one(task: Task) -> RunResult:
        if gate is None:
            return (await kit.run(task))[0]
        async with gate:
            return (await kit.run(task))[0]

    return list(await asyncio.gather(*(one(task) for task in tasks)))


async def test_twenty_jobs_through_one_lane_never_exceed_the_quota(kit: Kit) -> None:
    tasks = [kit.task("demo-video", {"prompt": f"shot {i}", "gen_s": 2 + i % 3}) for i in range(20)]
    results = await run_in_lane(kit, tasks)
    assert all(len(result.files) == 1 for result in results)
    stats = await kit.demo.stats()
    assert stats["jobs_created"] == 20
    assert stats["max_concurrent"] <= 3
    assert stats["rate_limited"] == 0  # the lane never even asked for a 4th slot
    assert stats["duplicate_submits"] == 0
    assert stats["early_requests"] == 0


async def test_over_quota_submits_wait_for_the_retry_after_and_succeed(kit: Kit) -> None:
    # No lane at all: 6 at once on a quota of 3. The provider refuses the
    # extra ones with 429 + retry-after-ms; they wait it out, in place.
    tasks = [kit.task("demo-video", {"prompt": f"burst {i}", "gen_s": 20}) for i in range(6)]
    results = await run_in_lane(kit, tasks, lane=None)
    assert all(result.files for result in results)
    stats = await kit.demo.stats()
    assert stats["rate_limited"] >= 1
    assert stats["max_concurrent"] <= 3
    assert stats["jobs_created"] == 6
    assert stats["early_requests"] == 0, stats["early_log"]
    assert stats["duplicate_submits"] == 0


async def test_a_429_storm_ends_with_every_task_done_and_no_early_request(kit: Kit) -> None:
    # Retry-After must outlast the demo's grace for requests already on the
    # wire (0.5 s) for an early request to be detectable at all.
    await kit.demo.mode(mode="429_storm", count=8, retry_after_s=1.2, header="ms")
    tasks = [kit.task("demo-video", {"prompt": f"storm {i}", "gen_s": 2}) for i in range(10)]
    results = await run_in_lane(kit, tasks)
    assert all(result.files for result in results)
    stats = await kit.demo.stats()
    assert stats["rate_limited"] == 8
    assert stats["early_requests"] == 0, stats["early_log"]
    assert stats["jobs_created"] == 10
    assert stats["duplicate_submits"] == 0


async def test_retry_after_in_seconds_and_as_a_date_are_obeyed(kit: Kit) -> None:
    await kit.demo.mode(mode="429_storm", count=1, retry_after_s=1, header="seconds")
    await kit.demo.mode(mode="429_storm", count=1, retry_after_s=1, header="date")
    tasks = [kit.task("demo-video", {"prompt": f"slow {i}", "gen_s": 1}) for i in range(3)]
    loop = asyncio.get_running_loop()
    start = loop.time()
    results = await run_in_lane(kit, tasks)
    assert all(result.files for result in results)
    assert loop.time() - start >= 1.0  # real seconds: time_scale does not shrink them
    stats = await kit.demo.stats()
    assert stats["rate_limited"] == 2
    assert stats["early_requests"] == 0, stats["early_log"]


async def test_a_429_while_polling_changes_nothing_about_the_task(kit: Kit) -> None:
    await kit.demo.mode(mode="429_storm", count=3, retry_after_s=0.1, header="ms", only="poll")
    result, _ = await kit.run(kit.task("demo-video", {"prompt": "patient", "gen_s": 3}))
    assert result.files
    stats = await kit.demo.stats()
    assert stats["rate_limited"] == 3
    assert stats["early_requests"] == 0
    assert stats["jobs_created"] == 1


async def test_chat_and_jobs_of_one_vendor_share_the_lane_quota(kit: Kit) -> None:
    tasks = [kit.task("demo-chat-api", {"prompt": f"q{i}", "gen_s": 2}) for i in range(4)]
    tasks += [kit.task("demo-video", {"prompt": f"v{i}", "gen_s": 2}) for i in range(4)]
    results = await run_in_lane(kit, tasks)
    assert [r.text for r in results[:4]] == [f"echo: q{i}" for i in range(4)]
    stats = await kit.demo.stats()
    assert stats["max_concurrent_by_vendor"]["openai"] <= 3
    assert stats["early_requests"] == 0
