"""Issue 30 through the service: a priced model records what each task cost,
the job sums it, /metrics exports it per provider, and a provider's daily
budget stops the tasks that would cross it, saying why, on one host or on
three hosts sharing one PostgreSQL database (never overspent)."""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from tests.integration.test_webhooks import SECRET, Receiver, receiver
from tests.support.harness import Harness, host_service, running_service
from tests.support.pgdb import migrated_database

PRICE_USD = 0.01  # demo-chat-api's [pricing] per_request


def _chats(count: int, tag: str) -> list[dict[str, Any]]:
    return [
        {"model": "demo-chat-api", "params": {"prompt": f"{tag} {i}", "gen_s": 0.5}}
        for i in range(count)
    ]


async def _until(check: Any, what: str, timeout_s: float = 60.0) -> Any:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        found = await check()
        if found:
            return found
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"never: {what}")
        await asyncio.sleep(0.05)


async def _settled(h: Harness, job_id: str, succeeded: int) -> dict[str, Any] | None:
    """The job once `succeeded` tasks ran and none runs: what the budget allowed."""
    light = (await h.http.get(f"/v1/jobs/{job_id}?tasks=none")).json()
    counts = light["counts"]
    return light if counts["success"] >= succeeded and counts["running"] == 0 else None


async def _budget_reached(h: Harness) -> dict[str, Any] | None:
    lanes = (await h.http.get("/v1/lanes")).json()
    lanes = lanes["items"] if isinstance(lanes, dict) else lanes
    budget = next(lane["budget"] for lane in lanes if lane["owner"] == "demo")
    return budget if budget["reached"] else None


async def _all_told(h: Harness) -> bool:
    """Every event the host heard is built (or was another host's to tell) and sent."""
    log = (await h.http.get("/v1/webhooks/deliveries")).json()
    return bool(log["queued"] == 0 and log["delivering"] == 0)


def _told(hook: Receiver) -> list[str]:
    return [body["budget"]["provider"] for body in hook.events("budget.reached")]


async def test_costs_are_recorded_and_a_budget_stops_what_would_cross_it(
    tmp_path: Path,
) -> None:
    async with (
        receiver() as hook,
        running_service(
            tmp_path,
            profiles=("demo-chat-api",),
            budgets={"demo": 5 * PRICE_USD},
            webhook_urls=[hook.url],
            webhook_secret=SECRET,
        ) as h,
    ):
        job = await h.job("priced", _chats(8, "a cat"))
        assert job["tasks"][0]["cost_estimate_usd"] == PRICE_USD
        light = await _until(lambda: _settled(h, job["id"], 5), "5 tasks ran")
        budget = await _until(lambda: _budget_reached(h), "the demo budget is reached")
        assert budget["spent_usd"] == 5 * PRICE_USD and budget["daily_usd"] == 5 * PRICE_USD
        assert light["counts"]["success"] == 5 and light["counts"]["pending"] == 3
        assert light["cost_usd"] == 5 * PRICE_USD
        waiting = await h.task(job["tasks"][-1]["id"])
        assert waiting["state"] == "pending" and waiting["eta_s"] is None
        assert waiting["waiting"] == "budget demo/day: $0.05 of $0.05 spent"
        metrics = (await h.http.get("/metrics")).text
        assert 'dispatcher_cost_usd_total{provider="demo"} 0.05' in metrics
        assert 'dispatcher_budget_usd{provider="demo"} 0.05' in metrics
        finished = [await h.task(t["id"]) for t in job["tasks"]]
        assert sorted(t["cost_usd"] or 0 for t in finished) == [0] * 3 + [PRICE_USD] * 5
        # A webhook says so, once, however many rounds find the budget reached.
        await hook.wait_for(1, "budget.reached")
        await h.service.scheduler.round()
        told = hook.events("budget.reached")
        assert len(told) == 1 and told[0]["budget"]["provider"] == "demo"
        assert told[0]["budget"]["reason"] == "budget demo/day: $0.05 of $0.05 spent"
        # A reload that drops the budget (it came from no file: the setting is
        # read again) lets the waiting tasks run at once.
        answer = (await h.http.post("/v1/reload")).json()
        assert answer["settings"] == {"budgets": {}}
        h.service.scheduler.wake()
        assert (await h.wait_job(job["id"]))["counts"]["success"] == 8


async def test_a_budget_holds_exactly_under_three_hosts_on_one_postgresql(
    tmp_path: Path,
) -> None:
    with migrated_database() as url:
        async with AsyncExitStack() as stack:
            hosts = [
                await stack.enter_async_context(
                    host_service(
                        tmp_path, name, ("demo-chat-api",), url, 0.02, budgets={"demo": 0.07}
                    )
                )
                for name in ("a", "b", "c")
            ]
            job = await hosts[0].job("hammered", _chats(15, "a dog"))
            # Every host serves the provider's queue; all of them stop at the budget.
            light = await _until(lambda: _settled(hosts[1], job["id"], 7), "7 tasks ran")
            for h in hosts:
                await _until(lambda h=h: _budget_reached(h), f"budget reached on {h}")
            assert light["counts"]["success"] == 7 and light["counts"]["pending"] == 8
            assert light["cost_usd"] <= 7 * PRICE_USD + 1e-9
            waiting = await hosts[2].task(job["tasks"][-1]["id"])
            assert waiting["waiting"] == "budget demo/day: $0.07 of $0.07 spent"


async def test_three_hosts_tell_a_reached_budget_once(tmp_path: Path) -> None:
    """Each host finds the budget reached on its own; the receivers hear it once."""
    with migrated_database() as url:
        async with receiver() as hook, AsyncExitStack() as stack:
            hosts = [
                await stack.enter_async_context(
                    host_service(
                        tmp_path,
                        name,
                        ("demo-chat-api",),
                        url,
                        0.02,
                        budgets={"demo": 0.03},
                        webhook_urls=[hook.url],
                        webhook_secret=SECRET,
                    )
                )
                for name in ("a", "b", "c")
            ]
            job = await hosts[0].job("hammered", _chats(9, "a fox"))
            await _until(lambda: _settled(hosts[1], job["id"], 3), "3 tasks ran")
            for h in hosts:
                h.service.scheduler.wake()
                await _until(lambda h=h: _budget_reached(h), f"budget reached on {h}")
            for h in hosts:
                await _until(lambda h=h: _all_told(h), f"webhooks sent by {h}")
            assert _told(hook) == ["demo"]


async def test_a_restarted_service_does_not_tell_the_same_day_again(tmp_path: Path) -> None:
    async with receiver() as hook:
        for run in ("first", "after a restart"):
            async with running_service(
                tmp_path,
                profiles=("demo-chat-api",),
                budgets={"demo": 2 * PRICE_USD},
                webhook_urls=[hook.url],
                webhook_secret=SECRET,
            ) as h:
                await h.job(run, _chats(3, run))
                await _until(lambda h=h: _budget_reached(h), f"budget reached, {run}")
                await _until(lambda h=h: _all_told(h), f"webhooks sent, {run}")
        assert _told(hook) == ["demo"]
