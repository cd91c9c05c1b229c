"""Benchmark 3: dispatch overhead with instant tasks.

2,000 chat tasks whose remote side answers at once (`gen_s = 0` on the demo
provider, quota 5, `DISPATCHER_CONCURRENCY={"demo": 5}`) are submitted over
HTTP, one `POST /v1/tasks` each, by a client that keeps 32 requests in
flight (32 keep-alive connections of `bench.lightclient`): as fast as the
service accepts them. The service (`python -m
dispatcher`, logging at INFO to a file as in production), the vendor and this
client are three processes on the same 2 cores.

Figures, from the service's own rows (read from its SQLite file after it
stopped): end-to-end tasks/s = tasks / (last `finished_at` - first submit
sent), and the time from submit to terminal (`finished_at - created_at`)
minus the remote time (0 here: the vendor answers at once), p50 and p99.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import psutil

from bench.common import (
    BenchResult,
    Check,
    PeakRss,
    ServiceProc,
    Vendor,
    call,
    fresh_dir,
    mean,
    percentile,
    profiles_dir,
    r,
    read_tasks,
    service_env,
)
from bench.lightclient import LightClient

TASKS = 2000
IN_FLIGHT = 32
QUOTA = 5
TARGET_TASKS_PER_S = 300.0
MODEL = "demo-chat-api"
# Bounds that keep `make bench` within its ten minutes when the service is slow.
SUBMIT_BUDGET_S = 75.0
DRAIN_BUDGET_S = 30.0


async def submit_all(
    clients: Sequence[LightClient],
    count: int,
    tag: str,
    budget_s: float,
    *,
    rate_per_s: float | None = None,
) -> tuple[float, float, list[float]]:
    """POST `count` tasks, one outstanding per client; (start, end, latencies).

    Stops early (fewer tasks) when `budget_s` runs out. `rate_per_s`: the
    i-th no sooner than start + i / rate (a steady rate, not a flood).
    """
    counter = itertools.count()
    latencies: list[float] = []
    begun = time.monotonic()
    deadline = begun + budget_s

    async def worker(client: LightClient) -> None:
        while (i := next(counter)) < count and time.monotonic() < deadline:
            if rate_per_s is not None:
                await asyncio.sleep(max(0.0, begun + i / rate_per_s - time.monotonic()))
            body = {"model": MODEL, "params": {"prompt": f"{tag} task {i}", "gen_s": 0}}
            t0 = time.perf_counter()
            for _ in range(5):
                status, text = await client.post_json("/v1/tasks", body)
                if status in (200, 201):
                    break
                await asyncio.sleep(0.05)
            else:
                raise RuntimeError(f"submit refused: {status} {text[:300]!r}")
            latencies.append(time.perf_counter() - t0)

    start = time.time()
    await asyncio.gather(*(worker(client) for client in clients))
    return start, time.time(), latencies


async def wait_drained(client: httpx.AsyncClient, timeout_s: float, poll_s: float = 0.1) -> bool:
    """True once no lane has queued or running work (asked every `poll_s`)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        lanes = (await call(client, "GET", "/v1/lanes")).json()
        if all(lane["queued"] == 0 and not lane["running"] for lane in lanes):
            return True
        await asyncio.sleep(poll_s)
    return False


async def run(work: Path, *, tasks: int = TASKS) -> BenchResult:
    work = fresh_dir(work)
    profiles = profiles_dir(work / "profiles", [MODEL])
    with Vendor(time_scale=1.0, quota=QUOTA) as vendor:
        env = service_env(profiles, vendor.url, time_scale=1.0, concurrency={"demo": QUOTA})
        state = work / "state"
        # The service as `python -m dispatcher` runs it; under BENCH_PROFILE the
        # same service in `bench.service_child`, which can profile itself.
        module = "bench.service_child" if os.environ.get("BENCH_PROFILE") else "dispatcher"
        # From `python -m dispatcher` to the port and token being written and
        # /healthz answering: what an operator waits after starting it.
        launched = time.monotonic()
        with ServiceProc(state, env, work / "service.log", module=module) as service:
            startup_s = time.monotonic() - launched
            cpu0 = service.cpu_s()
            times0 = psutil.Process(service.pid).cpu_times()
            # One light client (one keep-alive connection) per request in
            # flight: 32 connections, 32 POSTs in flight. Not httpx: its
            # AsyncClient cost as much CPU per request as the service spent on
            # the whole task, on the same 2 cores (`bench.lightclient`).
            async with contextlib.AsyncExitStack() as stack:
                peak = stack.enter_context(PeakRss(service.pid))
                clients = [
                    await stack.enter_async_context(LightClient(service.url, service.token))
                    for _ in range(IN_FLIGHT)
                ]
                start, submitted_at, submit_lat = await submit_all(
                    clients, tasks, "b3", budget_s=SUBMIT_BUDGET_S
                )
                reader = await stack.enter_async_context(service.async_client(limit=1))
                drained = await wait_drained(reader, timeout_s=DRAIN_BUDGET_S)
            cpu_s = service.cpu_s() - cpu0
            times = psutil.Process(service.pid).cpu_times()
            # Kernel time (socket sends and receives, SQLite's file writes) is
            # what Python-level work cannot shrink; shown apart from user time.
            sys_s = times.system - times0.system
            rss = service.rss_mb()
        stats = vendor.stats()
    rows = read_tasks(state / "dispatcher.db")
    done = [t for t in rows if t["state"] == "success"]
    last_finish = max((t["finished_at"] for t in done), default=float("nan"))
    elapsed = last_finish - start
    overhead = [t["finished_at"] - t["created_at"] for t in done]  # remote time is 0
    queue = [t["started_at"] - t["created_at"] for t in done]
    run_s = [t["finished_at"] - t["started_at"] for t in done]
    rate = len(done) / elapsed if elapsed > 0 else 0.0
    figures: dict[str, Any] = {
        "tasks": tasks,
        "startup_to_serving_s": r(startup_s),
        "submitted": len(submit_lat),
        "succeeded": len(done),
        "drained": drained,
        "in_flight": IN_FLIGHT,
        "quota": QUOTA,
        "elapsed_s": r(elapsed),
        "submit_phase_s": r(submitted_at - start),
        "submit_rate_per_s": r(len(submit_lat) / (submitted_at - start), 1),
        "tasks_per_s": r(rate, 1),
        "submit_to_terminal_minus_remote_p50_ms": r(percentile(overhead, 50) * 1000, 1),
        "submit_to_terminal_minus_remote_p99_ms": r(percentile(overhead, 99) * 1000, 1),
        "queue_wait_p50_ms": r(percentile(queue, 50) * 1000, 1),
        "run_p50_ms": r(percentile(run_s, 50) * 1000, 1),
        "run_p99_ms": r(percentile(run_s, 99) * 1000, 1),
        "http_submit_p50_ms": r(percentile(submit_lat, 50) * 1000, 1),
        "http_submit_p99_ms": r(percentile(submit_lat, 99) * 1000, 1),
        "http_submit_mean_ms": r(mean(submit_lat) * 1000, 1),
        "service_cpu_s": r(cpu_s, 2),
        "service_cpu_ms_per_task": r(cpu_s / max(1, len(done)) * 1000, 2),
        "service_cpu_sys_ms_per_task": r(sys_s / max(1, len(done)) * 1000, 2),
        "service_rss_mb_after": r(rss, 1),
        "service_rss_mb_peak": r(max(peak.peak_mb, rss), 1),
        "vendor_requests": stats.get("requests"),
        "vendor_rate_limited": stats.get("rate_limited"),
        "vendor_max_concurrent": stats.get("max_concurrent"),
    }
    checks = [
        Check(
            "dispatch: tasks/s end to end",
            f">= {TARGET_TASKS_PER_S:g} tasks/s (SQLite, 2 cores)",
            f"{rate:.0f} tasks/s",
            rate >= TARGET_TASKS_PER_S and len(done) == tasks,
            "" if len(done) == tasks else f"only {len(done)} of {tasks} done within the budget",
        ),
        Check(
            "dispatch: submit->terminal minus remote",
            "p50 / p99 reported",
            f"p50 {figures['submit_to_terminal_minus_remote_p50_ms']} ms, "
            f"p99 {figures['submit_to_terminal_minus_remote_p99_ms']} ms",
            None,
        ),
    ]
    checks.append(
        Check(
            "dispatch: `python -m dispatcher` to serving",
            "reported",
            f"{startup_s:.2f} s (empty store, 1 profile)",
            None,
        )
    )
    result = BenchResult("dispatch", "Dispatch overhead: 2,000 instant tasks", figures, checks)
    LATEST[tasks] = result
    return result


# This process's latest result per task count: benchmark 5 compares the
# peers with it when both run in one `python -m bench` (the same minutes of
# the same machine) instead of spending another run on it.
LATEST: dict[int, BenchResult] = {}
