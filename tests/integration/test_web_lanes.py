"""Web lanes in the real service: real Chromium against the bundled demo web model."""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import os
import re
from itertools import pairwise
from pathlib import Path

import httpx
import psutil
import pytest

from dispatcher.models import Kind
from tests.support.harness import Harness, running_service
from webrunner.runner import WebRunner

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]

# 90 s stale -> 4.5 s; 15 s heartbeat -> 0.75 s: long enough for a browser start.
SCALE = 0.05


def account_browsers(state_dir: Path, account: str) -> list[psutil.Process]:
    marker = f"--user-data-dir={os.path.realpath(state_dir / 'browser' / account)}"
    alive = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        if proc.info["status"] != psutil.STATUS_ZOMBIE and marker in (proc.info["cmdline"] or []):
            alive.append(proc)
    return alive


def unknown_browsers(h: Harness, account: str) -> list[psutil.Process]:
    """The account's browser processes other than the one its runner keeps open (and children)."""
    runner = h.service.runners[Kind.WEB]
    assert isinstance(runner, WebRunner)
    known: set[int] = set()
    pid = runner.open_browsers().get(account)
    if pid is not None:
        with contextlib.suppress(psutil.Error):
            known = {pid, *(c.pid for c in psutil.Process(pid).children(recursive=True))}
    return [p for p in account_browsers(h.state_dir, account) if p.pid not in known]


# Nominal seconds: an API task runs 1 s real, so three waves of three are 3 s
# while the web answer (400, 20 s real) holds its lane.
API_GEN_S = 20
WEB_ANSWER_S = 400
# How long a task may wait for a free slot of its lane: half an API task
# (0.5 s real; 0.3 s was seen at load 20 on two cores), so a freed slot is
# never left idle for long, and far below the web answer a task would wait
# for if it waited on the web lane. The dispatch latency itself is measured
# by `python -m bench dispatch`.
SLOT_WAIT_S = API_GEN_S / 2


def most_at_once(runs: list[tuple[float, float]]) -> int:
    """The most of these (start, end) intervals that overlap at one moment."""
    edges = sorted([(start, 1) for start, _ in runs] + [(end, -1) for _, end in runs])
    running = peak = 0
    for _, step in edges:  # an end sorts before a start at the same instant
        running += step
        peak = max(peak, running)
    return peak


async def test_api_tasks_never_wait_for_a_busy_web_lane(tmp_path: Path) -> None:
    async with running_service(
        tmp_path, profiles=("demo-chat", "demo-chat-api"), time_scale=SCALE
    ) as h:
        await h.http.post("/v1/accounts/demo-2/disable", json={"reason": "one web lane is enough"})
        web = await h.submit("demo-chat", f"a long web answer [duration={WEB_ANSWER_S}]")
        await h.wait_task(web["id"], {"running"})
        api_ids = [
            (await h.submit("demo-chat-api", f"quick {i}", gen_s=API_GEN_S))["id"] for i in range(9)
        ]
        api = [await h.wait_task(task_id) for task_id in api_ids]
        assert (await h.task(web["id"]))["state"] == "running", "web lane finished too early"
        assert all(t["state"] == "success" for t in api)
        # The lane's three slots were used at once: it was not serialised.
        # (Not `== 3`: a slot frees when the run returns, a few ms before its
        # finished_at is written, so stamps can overlap a fourth by that much.)
        assert most_at_once([(t["started_at"], t["finished_at"]) for t in api]) >= 3
        # Replay the lane's three slots: each task must start within
        # SLOT_WAIT_S of the moment a slot was free for it.
        slots = [0.0, 0.0, 0.0]
        for task in sorted(api, key=lambda t: t["started_at"]):
            free_at = max(task["created_at"], heapq.heappop(slots))
            assert task["started_at"] - free_at < SLOT_WAIT_S * SCALE, task
            heapq.heappush(slots, task["finished_at"])
        await h.http.post(f"/v1/tasks/{web['id']}/cancel")
        assert (await h.wait_task(web["id"]))["state"] == "canceled"


async def test_web_job_on_one_account_and_two_accounts_in_parallel(tmp_path: Path) -> None:
    # Prewarm off: this checks the keeper's reuse between two tasks (the first
    # starts the browser, the second finds it); a browser started before the
    # first task would make both reuses (tests/integration/test_browser_prewarm.py).
    async with running_service(
        tmp_path, profiles=("demo-chat",), time_scale=SCALE, browser_prewarm=False
    ) as h:
        await h.http.post("/v1/accounts/demo-2/disable", json={"reason": "single account run"})
        job = await h.job(
            "one account",
            [
                {"model": "demo-chat", "params": {"prompt": f"shot {i} [duration=20]"}}
                for i in range(2)
            ],
        )
        done = await h.wait_job(job["id"], timeout_s=120)
        assert done["state"] == "success", done["counts"]
        assert {t["owner"] for t in done["tasks"]} == {"demo-1"}
        runs = sorted((t["started_at"], t["finished_at"]) for t in done["tasks"])
        assert all(a[1] <= b[0] for a, b in pairwise(runs)), "overlap on one account"
        assert all(t["result"]["text"].startswith("(brief)") for t in done["tasks"])
        # The second task ran in the browser the first one left open.
        assert [
            t["result"]["meta"]["browser_reused"]
            for t in sorted(done["tasks"], key=lambda t: t["started_at"])
        ] == [False, True]
        metrics = (await h.http.get("/metrics")).text
        assert re.search(r"^dispatcher_browser_reuses_total 1\.0$", metrics, re.M), metrics

        await h.http.post("/v1/accounts/demo-2/enable")
        job = await h.job(
            "two accounts",
            [
                {"model": "demo-chat", "params": {"prompt": f"pair {i} [duration=60]"}}
                for i in range(2)
            ],
        )
        done = await h.wait_job(job["id"], timeout_s=120)
        assert done["state"] == "success", done["counts"]
        by_account: dict[str, list[tuple[float, float]]] = {}
        for task in done["tasks"]:
            by_account.setdefault(task["owner"], []).append(
                (task["started_at"], task["finished_at"])
            )
        assert set(by_account) == {"demo-1", "demo-2"}
        for runs in by_account.values():  # each account one at a time
            runs.sort()
            assert all(a[1] <= b[0] for a, b in pairwise(runs))
        first, second = (sorted(r)[0] for r in by_account.values())
        assert first[0] < second[1] and second[0] < first[1], "the two accounts never overlapped"
        stats = await h.demo_stats(h.demo_web)
        assert stats["collisions"] == 0
        for account in ("demo-1", "demo-2"):
            assert unknown_browsers(h, account) == []
        # An operator takes demo-1 out to log it in again by hand: its kept
        # browser must let go of the profile; demo-2's stays for its next task.
        assert account_browsers(h.state_dir, "demo-1") and account_browsers(h.state_dir, "demo-2")
        await h.http.post("/v1/accounts/demo-1/disable", json={"reason": "re-login"})
        deadline = asyncio.get_running_loop().time() + 30
        while account_browsers(h.state_dir, "demo-1"):
            assert asyncio.get_running_loop().time() < deadline, "disabled account kept its browser"
            await asyncio.sleep(0.1)
        assert account_browsers(h.state_dir, "demo-2")
    # Kept open between tasks, closed when the service stops.
    for account in ("demo-1", "demo-2"):
        assert account_browsers(tmp_path / "state", account) == []


async def test_expired_session_holds_the_task_and_marks_the_account(tmp_path: Path) -> None:
    async with running_service(tmp_path, profiles=("demo-chat",), time_scale=SCALE) as h:
        await h.http.post("/v1/accounts/demo-2/disable", json={"reason": "single account run"})
        await h.browsers_started()  # the session expires while the service runs
        await h.demo_mode({"mode": "expired"}, h.demo_web)
        task = await h.submit("demo-chat", "are we logged in?")
        deadline = asyncio.get_running_loop().time() + 60
        while not (accounts := {a["name"]: a for a in (await h.http.get("/v1/accounts")).json()})[
            "demo-1"
        ]["needs_attention"]:
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.05)
        assert "logged out" in accounts["demo-1"]["reason"]
        held = await h.task(task["id"])
        assert (held["state"], held["attempt"]) == ("pending", 1)  # no attempt spent
        nxt = await h.submit("demo-chat", "should wait for an operator")
        await asyncio.sleep(1.0)
        assert (await h.task(nxt["id"]))["state"] == "pending"
        # The operator logs the account in again (the demo's reset restores sessions).
        async with httpx.AsyncClient() as client:
            (await client.post(f"{h.demo_web}/__reset")).raise_for_status()
        await h.http.post("/v1/accounts/demo-1/enable")
        for task_id in (task["id"], nxt["id"]):
            done = await h.wait_task(task_id, timeout_s=60)
            assert (done["state"], done["attempt"]) == ("success", 1)


async def test_hung_page_is_reclaimed_retried_and_leaves_no_browser(tmp_path: Path) -> None:
    async with running_service(tmp_path, profiles=("demo-chat",), time_scale=SCALE) as h:
        await h.http.post("/v1/accounts/demo-2/disable", json={"reason": "single account run"})
        await h.demo_mode({"mode": "hang"}, h.demo_web)
        task = await h.submit("demo-chat", "this page freezes")
        await h.wait_task(task["id"], {"running"})
        # Stale after 90 s x 0.05 = 4.5 s without a heartbeat; then retried.
        deadline = asyncio.get_running_loop().time() + 60
        while (await h.task(task["id"]))["attempt"] < 2:
            assert asyncio.get_running_loop().time() < deadline, await h.task(task["id"])
            await asyncio.sleep(0.1)
        reclaimed = await h.task(task["id"])
        assert reclaimed["error"] is None or reclaimed["error"]["kind"] == "stale"
        await h.demo_mode({"mode": "normal"}, h.demo_web)
        done = await h.wait_task(task["id"], timeout_s=60)
        assert done["state"] == "success" and done["attempt"] == 2
        assert unknown_browsers(h, "demo-1") == []  # the hung one is gone
        metrics = (await h.http.get("/metrics")).text
        assert "dispatcher_stale_reclaims_total 1.0" in metrics
        launches = re.search(r"^dispatcher_browser_launches_total (\S+)$", metrics, re.M)
        assert launches is not None and float(launches.group(1)) >= 2  # the hung one and the retry
