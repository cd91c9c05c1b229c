"""Benchmark 4: resident memory and store writes.

The service (`bench.service_child`: the service as `python -m dispatcher`
runs it, in its own process, so psutil's RSS is the service's alone) with
the `demo-chat-api` model against a demo vendor answering at once (quota 5).

1. RSS idle, two seconds after start.
2. The provider is switched off (the operator's switch), 10,000 tasks are
   submitted as ten jobs of 1,000, and RSS is read with all 10,000 pending.
3. The provider is switched on; the queue drains; RSS after draining.
4. Steps 2-3 three times more: the slope of RSS after each drain, from the
   second drain on, shows whether draining leaves memory behind (a leak
   grows it cycle by cycle; the first two cycles fill what is bounded on
   purpose: the store's write counter, SQLite's page cache).

Writes: `SqliteStore.writes` counts rows written per task id; the child also
counts the task events the ledger publishes (one on creation, one per state
transition). A task is within budget when its writes do not exceed its
transitions (plus a remote-id write and heartbeats, which these instant chat
tasks never need). Both are read after each drain for that cycle's tasks
(the store keeps counts for its most recent 10,000-20,000 tasks only), and
the child then forgets its event counts, so that neither reads as a leak.
"""

from __future__ import annotations

import asyncio
import math
import statistics
import time
from pathlib import Path
from typing import Any

import httpx

from bench.common import (
    BenchResult,
    Check,
    ServiceProc,
    Vendor,
    call,
    fresh_dir,
    mean,
    profiles_dir,
    r,
    service_env,
)

TASKS = 10_000
CHUNK = 1_000
# The first two cycles fill what is bounded on purpose (the store's write
# counter keeps its last 10,000-20,000 tasks; SQLite's page cache warms up);
# growth is read from the second drain to the last, where a leak would show.
# Four cycles: the fewest that leave three drains for the slope (five cost
# another 25 s of `make bench`'s ten minutes for a fourth point).
CYCLES = 4
WARM_CYCLES = 2
QUOTA = 5
MODEL = "demo-chat-api"
PROVIDER = "demo"
TARGET_PENDING_MB = 200.0
# RSS after a drain wanders by about +/-1 MB from one cycle to the next
# (allocator and SQLite page cache; an 8-cycle run here read 68, 70, 70, 71,
# 70, 69, 70, 71 MB), so growth is the least-squares slope over the drains
# after the warm ones: a leak of 50 bytes per task shows as 0.5 MB per cycle.
GROWTH_TOLERANCE_MB_PER_CYCLE = 0.5
# The whole benchmark must fit `make bench`'s ten minutes with the others.
BUDGET_S = 140.0


async def _settle(service: ServiceProc, seconds: float = 2.0) -> float:
    await asyncio.sleep(seconds)
    return service.rss_mb()


async def _submit(client: httpx.AsyncClient, tasks: int, cycle: int) -> tuple[list[str], float]:
    ids: list[str] = []
    t0 = time.monotonic()
    for start in range(0, tasks, CHUNK):
        batch = [
            {"model": MODEL, "params": {"prompt": f"mem c{cycle} t{i}", "gen_s": 0}}
            for i in range(start, min(tasks, start + CHUNK))
        ]
        answer = await call(
            client, "POST", "/v1/jobs", json={"name": f"mem {cycle}/{start}", "tasks": batch}
        )
        if answer.status_code != 201:
            raise RuntimeError(f"job refused: {answer.status_code} {answer.text[:300]}")
        ids += [t["id"] for t in answer.json()["tasks"]]
    return ids, time.monotonic() - t0


async def _drain(
    service: ServiceProc, client: httpx.AsyncClient, total: int, timeout_s: float
) -> dict[str, Any]:
    t0 = time.monotonic()
    peak = service.rss_mb()
    drained = False
    left = total
    while time.monotonic() - t0 < timeout_s:
        lanes = (await call(client, "GET", "/v1/lanes")).json()
        peak = max(peak, service.rss_mb())
        left = sum(lane["queued"] + len(lane["running"]) for lane in lanes)
        if left == 0:
            drained = True
            break
        await asyncio.sleep(0.5)
    return {
        "drained": drained,
        "seconds": time.monotonic() - t0,
        "peak_rss_mb": peak,
        "done": total - left,
    }


async def run(
    work: Path, *, tasks: int = TASKS, cycles: int = CYCLES, budget_s: float = BUDGET_S
) -> BenchResult:
    work = fresh_dir(work)
    profiles = profiles_dir(work / "profiles", [MODEL])
    cycle_figures: list[dict[str, Any]] = []
    notes: list[str] = []
    writes: list[int] = []
    transitions: list[int] = []
    started = time.monotonic()
    with Vendor(time_scale=1.0, quota=QUOTA) as vendor:
        env = service_env(profiles, vendor.url, time_scale=1.0, concurrency={PROVIDER: QUOTA})
        with ServiceProc(work / "state", env, work / "service.log", "bench.service_child") as svc:
            idle = await _settle(svc)
            async with svc.async_client(limit=4, timeout_s=300) as client:
                for cycle in range(cycles):
                    left = budget_s - (time.monotonic() - started)
                    if cycle and (
                        not cycle_figures[-1]["drained"]
                        or cycle_figures[-1]["drain_s"] * 1.5 > left
                    ):
                        notes.append(
                            f"cycle {cycle + 1} skipped: the time budget of "
                            f"{budget_s:.0f} s would not cover another drain"
                        )
                        break
                    off = await call(
                        client,
                        "POST",
                        f"/v1/accounts/{PROVIDER}/disable",
                        json={"reason": "benchmark: hold the queue"},
                    )
                    off.raise_for_status()
                    ids, submit_s = await _submit(client, tasks, cycle)
                    pending = await _settle(svc)
                    lanes = (await call(client, "GET", "/v1/lanes")).json()
                    queued = sum(lane["queued"] for lane in lanes)
                    on = await call(client, "POST", f"/v1/accounts/{PROVIDER}/enable")
                    on.raise_for_status()
                    left = budget_s - (time.monotonic() - started)
                    drain = await _drain(svc, client, len(ids), timeout_s=max(30.0, left))
                    after = await _settle(svc)
                    # Audited cycle by cycle: the service keeps write counts for
                    # its recent tasks only, and the child's own event counts
                    # must not pile up as if the service leaked them.
                    counters = svc.child_stats()
                    writes += [counters["writes"].get(i, 0) for i in ids]
                    transitions += [counters["transitions"].get(i, 0) for i in ids]
                    svc.forget_child_stats()
                    cycle_figures.append(
                        {
                            "submitted": len(ids),
                            "queued_seen": queued,
                            "submit_s": r(submit_s, 2),
                            "rss_pending_mb": r(pending, 1),
                            "drained": drain["drained"],
                            "drain_s": r(drain["seconds"], 1),
                            "done_in_drain": drain["done"],
                            "drain_tasks_per_s": r(drain["done"] / drain["seconds"], 1),
                            "rss_peak_while_draining_mb": r(drain["peak_rss_mb"], 1),
                            "rss_after_drain_mb": r(after, 1),
                        }
                    )
                    if not drain["drained"]:
                        notes.append(
                            f"cycle {cycle + 1}: the queue did not drain within the "
                            f"budget ({drain['done']} of {len(ids)} done)"
                        )
    done_cycles = len(cycle_figures)
    over = sum(1 for w, t in zip(writes, transitions, strict=True) if w > t)
    first = cycle_figures[0]
    last = cycle_figures[-1]
    steady = [c["rss_after_drain_mb"] for c in cycle_figures[WARM_CYCLES - 1 :]]
    growth = (
        statistics.linear_regression(range(len(steady)), steady).slope
        if len(steady) > 2
        else math.nan
    )
    figures: dict[str, Any] = {
        "tasks_per_cycle": tasks,
        "cycles": done_cycles,
        "rss_idle_mb": r(idle, 1),
        "by_cycle": cycle_figures,
        "rss_growth_per_cycle_mb": r(growth, 3),  # slope from the last warm drain on
        "rss_growth_first_to_last_drain_mb": r(
            last["rss_after_drain_mb"] - first["rss_after_drain_mb"], 2
        ),
        "writes_per_task_mean": r(mean(writes), 3),
        "writes_per_task_max": max(writes, default=0),
        "transitions_per_task_mean": r(mean(transitions), 3),
        "tasks_with_writes_over_transitions": over,
    }
    checks = [
        Check(
            "memory: RSS with 10,000 pending",
            f"< {TARGET_PENDING_MB:g} MB",
            f"{first['rss_pending_mb']:.0f} MB (idle {idle:.0f} MB)",
            first["rss_pending_mb"] < TARGET_PENDING_MB,
        ),
        Check(
            "memory: growth after draining",
            f"none (slope over drains {WARM_CYCLES}-{CYCLES} "
            f"<= {GROWTH_TOLERANCE_MB_PER_CYCLE:g} MB per {tasks:,} tasks)",
            f"{growth:+.2f} MB per cycle (after drains: "
            + ", ".join(f"{c['rss_after_drain_mb']:.0f}" for c in cycle_figures)
            + " MB)"
            if done_cycles > WARM_CYCLES + 1 and all(c["drained"] for c in cycle_figures)
            else "not measured: " + "; ".join(notes),
            growth <= GROWTH_TOLERANCE_MB_PER_CYCLE and all(c["drained"] for c in cycle_figures)
            if done_cycles > WARM_CYCLES + 1
            else False,  # a target not measured is not met
        ),
        Check(
            "writes: store writes per task",
            "<= transitions (create + each state change)",
            f"{mean(writes):.2f} writes vs {mean(transitions):.2f} transitions; {over} tasks over",
            over == 0,
        ),
    ]
    return BenchResult("memory", "Memory and store writes", figures, checks, notes)
