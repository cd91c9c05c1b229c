"""Web accounts that look after themselves: usage caps, human checks, logouts,
stalled pages. Real Chromium against the demo web model's per-user control."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from dispatcher.models import Kind
from dispatcher.scheduling.protocol import RunContext
from tests.support.harness import Harness, running_service
from tests.support.helpers import demo_chat_on
from webrunner.runner import WebRunner

pytestmark = [pytest.mark.browser, pytest.mark.timeout(120)]

SCALE = 0.05  # 90 s stale -> 4.5 s: long enough for a browser start


async def set_user(h: Harness, user: str, body: dict[str, Any]) -> None:
    async with httpx.AsyncClient() as client:
        response = await client.post(f"{h.demo_web}/__users/{user}", json=body)
        response.raise_for_status()


@asynccontextmanager
async def account_events(h: Harness) -> AsyncIterator[list[dict[str, Any]]]:
    """The `account` events of the SSE stream, as they arrive."""
    seen: list[dict[str, Any]] = []
    opened = asyncio.Event()

    async def listen() -> None:
        async with h.http.stream("GET", "/v1/events") as stream:
            opened.set()
            async for line in stream.aiter_lines():
                if line.startswith("data:"):
                    event = json.loads(line[5:])
                    if event.get("type") == "account":
                        seen.append(event)

    listener = asyncio.create_task(listen())
    await asyncio.wait_for(opened.wait(), 10)
    try:
        yield seen
    finally:
        listener.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await listener


async def test_a_capped_account_cools_down_its_task_runs_on_the_other_then_it_reopens(
    tmp_path: Path,
) -> None:
    async with running_service(tmp_path, profiles=("demo-chat",), time_scale=SCALE) as h:
        await h.http.post("/v1/accounts/demo-2/disable", json={"reason": "start on demo-1"})
        await h.browsers_started()  # the cap comes while the service runs
        capped_at = time.time()
        await set_user(h, "demo-1", {"state": "limited", "reset_in_s": 8})
        set_s = time.time() - capped_at
        async with account_events(h) as events:
            task = await h.submit("demo-chat", "capped")
            capped = await h.wait_account("demo-1", "cooldown")
            seen_s = time.time() - capped_at
            # The account's state is written first, then the task's.
            held = await h.wait_task(task["id"], {"pending"})
            assert (held["state"], held["attempt"]) == ("pending", 1)
            # The page said "in N seconds" (what was left of 8, rounded): real
            # seconds, whatever the time scale (scaled, it would be 0.4 s; the
            # default cooldown, minutes). Not before the cap lifts; after it
            # by no more than the page took to be read, however slow the
            # machine is now.
            lifts_in_s = capped["until"] - capped_at
            assert 8 - 0.5 <= lifts_in_s <= 8 + 0.5 + set_s + seen_s, (lifts_in_s, set_s, seen_s)
            assert "usage limit" in capped["reason"]
            metrics = (await h.http.get("/metrics")).text
            assert 'dispatcher_account_state{account="demo-1",state="cooldown"} 1.0' in metrics
            assert 'dispatcher_account_state{account="demo-1",state="ok"} 0.0' in metrics

            await h.http.post("/v1/accounts/demo-2/enable")
            done = await h.wait_task(task["id"], timeout_s=60)
            assert (done["state"], done["attempt"]) == ("success", 1)
            assert done["result"]["meta"]["account"] == "demo-2"
            cooling = [e for e in events if e["account"]["state"] == "cooldown"]
            assert cooling and cooling[0]["account"]["name"] == "demo-1"
            assert cooling[0]["account"]["until"] == capped["until"]
            assert cooling[0]["previous"] == "ok"

        # With demo-2 off again, the next task waits for demo-1's cap to lift,
        # and runs there without anyone switching it back on.
        await h.http.post("/v1/accounts/demo-2/disable", json={"reason": "only demo-1"})
        later = await h.submit("demo-chat", "after the cap")
        done = await h.wait_task(later["id"], timeout_s=60)
        assert (done["state"], done["attempt"]) == ("success", 1)
        assert done["result"]["meta"]["account"] == "demo-1"
        assert done["started_at"] >= capped["until"]
        assert (await h.accounts())["demo-1"]["state"] == "ok"


async def test_a_human_check_and_a_logout_hold_the_task(tmp_path: Path) -> None:
    demo_chat_on(tmp_path, ("demo-1",))  # the one account the test uses
    async with running_service(tmp_path, profiles=(), time_scale=SCALE) as h:
        await h.browsers_started()  # the check comes while the service runs
        for condition, reason in (("challenge", "challenge"), ("logged_out", "logged out")):
            await set_user(h, "demo-1", {"state": condition})
            task = await h.submit("demo-chat", f"meets a {condition}")
            account = await h.wait_account("demo-1", "needs_attention")
            assert reason in account["reason"]
            held = await h.wait_task(task["id"], {"pending"})
            assert (held["state"], held["attempt"], held["owner"]) == ("pending", 1, None)

            # The operator solves it and switches the account back on: the task runs.
            await set_user(h, "demo-1", {"state": "ok"})
            await h.http.post("/v1/accounts/demo-1/enable")
            done = await h.wait_task(task["id"], timeout_s=60)
            assert (done["state"], done["attempt"]) == ("success", 1), condition


async def test_a_logout_is_not_charged_while_the_attempt_cleans_up_past_the_stale_bound(
    tmp_path: Path,
) -> None:
    """After the page showed the logout, the attempt keeps its evidence and
    closes its browser (seconds on a busy machine) before the scheduler
    hears of it. Held there past the stale bound, the task must not be
    reclaimed as stale: that charged a logout an attempt, one per try."""
    demo_chat_on(tmp_path, ("demo-1",))  # the one account the test uses
    async with running_service(tmp_path, profiles=(), time_scale=SCALE) as h:
        runner = h.service.runners[Kind.WEB]
        assert isinstance(runner, WebRunner)
        keep_evidence = runner._keep_evidence
        cleaning = asyncio.Event()
        go_on = asyncio.Event()

        async def slow_keep_evidence(ctx: RunContext, run: Any) -> None:
            cleaning.set()
            await go_on.wait()
            await keep_evidence(ctx, run)

        runner._keep_evidence = slow_keep_evidence  # type: ignore[method-assign]
        await h.browsers_started()
        await set_user(h, "demo-1", {"state": "logged_out"})
        task = await h.submit("demo-chat", "meets a logout")
        await asyncio.wait_for(cleaning.wait(), 60)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 2 * h.service.scheduler.stale_s
        while loop.time() < deadline:
            seen = await h.task(task["id"])
            assert (seen["state"], seen["attempt"]) == ("running", 1), seen
            await asyncio.sleep(0.1)
        go_on.set()
        await h.wait_account("demo-1", "needs_attention")
        held = await h.wait_task(task["id"], {"pending"})
        assert held["attempt"] == 1, held
        assert [a["error"]["kind"] for a in held["attempts"]] == ["requeued"], held["attempts"]
        assert "held: auth" in held["attempts"][0]["error"]["message"]


async def test_failures_of_one_kind_in_a_row_take_the_account_out(tmp_path: Path) -> None:
    async with running_service(
        tmp_path, profiles=("demo-chat",), time_scale=SCALE, account_failures_for_attention=2
    ) as h:
        await h.http.post("/v1/accounts/demo-2/disable", json={"reason": "one account"})
        await h.demo_mode({"mode": "error", "message": "something broke"}, base=h.demo_web)
        task = await h.submit("demo-chat", "fails twice")
        account = await h.wait_account("demo-1", "needs_attention")
        assert "2 page_error failures in a row" in account["reason"]
        held = await h.task(task["id"])
        assert (held["state"], held["attempt"]) == ("pending", 3)  # not failed: attempts left

        # Its model's pending tasks go to the other account.
        await h.demo_mode({"mode": "normal"}, base=h.demo_web)
        await h.http.post("/v1/accounts/demo-2/enable")
        done = await h.wait_task(task["id"], timeout_s=60)
        assert (done["state"], done["result"]["meta"]["account"]) == ("success", "demo-2")


async def test_a_stalled_page_is_reclaimed_and_retried(tmp_path: Path) -> None:
    demo_chat_on(tmp_path, ("demo-1",))  # the one account the test uses
    async with running_service(tmp_path, profiles=(), time_scale=SCALE) as h:
        # stall_s 120 nominal -> 6 s: the answer stops moving, the page stays busy.
        task = await h.submit("demo-chat", "stuck [mode=stall] [duration=2]")
        deadline = time.monotonic() + 60
        while (seen := await h.task(task["id"]))["attempt"] < 2:
            assert time.monotonic() < deadline, seen
            await asyncio.sleep(0.05)
        first = seen["attempts"][0]
        assert first["error"]["kind"] == "stalled", first
        assert "stall_s" in first["error"]["message"]
        metrics = (await h.http.get("/metrics")).text
        assert "dispatcher_stalled_reclaims_total 1.0" in metrics
        assert "dispatcher_stale_reclaims_total 0.0" in metrics
        await h.http.post(f"/v1/tasks/{task['id']}/cancel")
        assert (await h.wait_task(task["id"]))["state"] == "canceled"
