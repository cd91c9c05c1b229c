"""Benchmark 7: one batch of 2,000 instant tasks, submitted as each system's
users submit a batch.

The same job and vendor as benchmark 5 (one POST to the demo vendor, quota 5,
answering at once; each peer's worker at concurrency 5 with the library's own
command line), but the 2,000 tasks are handed over in one go: ours as
`dispatcher batch` does (one `POST /v1/jobs` holding every task), Celery a
`group(...).apply_async()`, Dramatiq a `group(...).run()`, procrastinate
`batch_defer`, RQ `Queue.enqueue_many`, arq its users' enqueue loop (it has
no batch call).

Per system: tasks/s = tasks / (last completion - the moment the batch call
began), and each task's latency from that same moment (what the submitter
waits for), p50 and p99; how long the batch call itself took; CPU per task of
the worker(s) and broker (ours: the service, SQLite inside it). Completion
times come from each system's own records, as in benchmark 5. A system cut
off by `BATCH_BUDGET_S` is reported at the rate it kept, its p99 marked
incomplete. Every system runs `ROUNDS` times, the rounds interleaved, each
in another order; its figures are its median round's (tasks/s), every
round's tasks/s beside them. One cut off in its first round runs once.
"""

from __future__ import annotations

import dataclasses
import os
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from bench import peers
from bench.common import (
    BenchResult,
    Check,
    PeakRss,
    ServiceProc,
    Vendor,
    call,
    fresh_dir,
    median_run,
    percentile,
    profiles_dir,
    r,
    read_tasks,
    round_order,
    service_env,
)
from bench.dispatch import MODEL, QUOTA, wait_drained

TASKS = 2000
# After its batch call, each system has this long to finish (the fast ones
# need 3-6 s on a quiet machine); arq and RQ (~30 tasks/s here) are cut off
# and reported at the rate they kept.
BATCH_BUDGET_S = 8.0
# Each system's figures are those of its median round (tasks/s): one run of
# ~3 s on a VM whose speed drifts within a minute compared the moment as
# much as the systems. A system cut off in its first round runs once.
ROUNDS = int(os.environ.get("BENCH_BATCH_ROUNDS", "3"))


async def run_ours(work: Path, vendor_url: str, tasks: int) -> dict[str, Any]:
    """The service with one job of `tasks` tasks, posted as `dispatcher batch` posts it."""
    profiles = profiles_dir(work / "profiles", [MODEL])
    env = service_env(profiles, vendor_url, time_scale=1.0, concurrency={"demo": QUOTA})
    state = work / "state"
    body = {
        "name": "bench-batch",
        "tasks": [
            {"model": MODEL, "params": {"prompt": f"batch task {i}", "gen_s": 0}}
            for i in range(tasks)
        ],
    }
    # Under BENCH_PROFILE the same service in `bench.service_child`, which profiles itself.
    module = "bench.service_child" if os.environ.get("BENCH_PROFILE") else "dispatcher"
    with (
        ServiceProc(state, env, work / "service.log", module=module) as service,
        PeakRss(service.pid) as peak,
    ):
        # As long as the CLI gives a job to be checked and stored (JOB_TIMEOUT_S_PER_TASK).
        async with service.async_client(limit=1, timeout_s=30.0 + 0.01 * tasks) as client:
            cpu0 = service.cpu_s()
            start = time.time()
            answer = await call(client, "POST", "/v1/jobs", json=body)
            call_s = time.time() - start
            answer.raise_for_status()
            drained = await wait_drained(client, timeout_s=BATCH_BUDGET_S)
        cpu_s = service.cpu_s() - cpu0
        rss_mb = max(peak.peak_mb, service.rss_mb())
    rows = read_tasks(state / "dispatcher.db")
    finishes = [t["finished_at"] for t in rows if t["state"] == "success"]
    return batch_figures(
        tasks,
        start,
        finishes,
        call_s=call_s,
        cpu_s=cpu_s,
        rss_mb=rss_mb,
        complete=drained and len(finishes) == tasks,
        note="one POST /v1/jobs (as `dispatcher batch`); SQLite",
    ) | {"version": metadata.version("dispatcher"), "broker_cpu_s": 0.0}


def batch_figures(
    tasks: int,
    start: float,
    finishes: list[float],
    *,
    call_s: float,
    cpu_s: float,
    rss_mb: float,
    complete: bool,
    note: str,
) -> dict[str, Any]:
    """Tasks/s and latency counted from the moment the batch call began."""
    latencies = [at - start for at in finishes]
    elapsed = max(finishes, default=start) - start
    return {
        "tasks": tasks,
        "succeeded": len(finishes),
        "complete": complete,
        "elapsed_s": r(elapsed),
        "tasks_per_s": r(len(finishes) / elapsed if elapsed > 0 else 0.0, 1),
        "batch_call_ms": r(call_s * 1000, 1),
        "submit_to_done_p50_ms": r(percentile(latencies, 50) * 1000, 1),
        "submit_to_done_p99_ms": r(percentile(latencies, 99) * 1000, 1),
        "worker_cpu_s": r(cpu_s, 2),
        "cpu_ms_per_task": r(cpu_s / max(1, len(finishes)) * 1000, 2),
        "peak_rss_mb": r(rss_mb, 1),
        "note": note,
    }


def _spread(row: dict[str, Any]) -> str:
    """ " (rounds 700-760)": the rounds' tasks/s, when there were several."""
    rounds = row.get("tasks_per_s_rounds") or []
    return f" (rounds {min(rounds):.0f}-{max(rounds):.0f})" if len(rounds) > 1 else ""


def batch_checks(rows: dict[str, dict[str, Any]], tasks: int) -> list[Check]:
    """Ours against the best peer on tasks/s, p99 no worse; every row reported."""
    ours = rows["dispatcher"]
    peer_rows = {k: v for k, v in rows.items() if k != "dispatcher" and "tasks_per_s" in v}
    best = max(peer_rows, key=lambda k: peer_rows[k]["tasks_per_s"], default=None)
    checks = []
    if best is None or "tasks_per_s" not in ours:
        checks.append(
            Check(
                "batch: tasks/s vs the best peer",
                ">= best peer's, p99 no worse",
                "no peer ran" if best is None else f"ours did not run: {ours.get('error')}",
                False,
            )
        )
    else:
        b = peer_rows[best]
        checks.append(
            Check(
                "batch: tasks/s vs the best peer",
                ">= best peer's, p99 no worse",
                f"ours {ours['tasks_per_s']:.0f}/s{_spread(ours)} p99 "
                f"{ours['submit_to_done_p99_ms']:.0f} ms; {best} {b['tasks_per_s']:.0f}/s"
                f"{_spread(b)} p99 {b['submit_to_done_p99_ms']:.0f} ms",
                ours["succeeded"] == tasks
                and ours["tasks_per_s"] >= b["tasks_per_s"]
                and ours["submit_to_done_p99_ms"] <= b["submit_to_done_p99_ms"],
            )
        )
    for name, row in rows.items():
        if "error" in row:
            checks.append(Check(f"batch: {name}", "runs", row["error"][:120], False))
            continue
        cut = "" if row["succeeded"] == tasks else f", cut off at {row['succeeded']} done"
        checks.append(
            Check(
                f"batch: {name} {row.get('version', '')}".strip(),
                "reported",
                f"{row['tasks_per_s']:.0f}/s, p50/p99 {row['submit_to_done_p50_ms']:.0f}/"
                f"{row['submit_to_done_p99_ms']:.0f} ms, batch call "
                f"{row['batch_call_ms']:.0f} ms, CPU {row['cpu_ms_per_task']:.2f} ms/task{cut}",
                None,
            )
        )
    return checks


async def run(work: Path, *, tasks: int = TASKS) -> BenchResult:
    work = fresh_dir(work)
    runs: dict[str, list[dict[str, Any]]] = {}
    failed: dict[str, dict[str, Any]] = {}
    notes: list[str] = []
    lanes = {lane.name: lane for lane in peers.LANES}
    names = ["dispatcher", *lanes]
    with Vendor(time_scale=1.0, quota=QUOTA) as vendor:
        for round_ in range(ROUNDS):
            round_dir = fresh_dir(work / f"r{round_}")
            for name in round_order(names, round_):
                done = runs.get(name, [])
                if name in failed or (done and done[0]["succeeded"] < tasks):
                    continue  # cut off once (arq, RQ): far behind, run once
                print(f"   {name} (round {round_ + 1}/{ROUNDS}) ...", flush=True)
                try:
                    if name == "dispatcher":
                        row = await run_ours(round_dir / name, vendor.url, tasks)
                    else:
                        # A fresh lane: the module's lanes keep benchmark 5's submits.
                        lane = dataclasses.replace(lanes[name], submits=[], finishes={})
                        row = await peers.run_lane(
                            lane, vendor.url, round_dir, tasks, BATCH_BUDGET_S, batch=True
                        )
                except Exception as exc:  # a system that cannot run is a finding, not a crash
                    failed[name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
                    if name != "dispatcher":
                        notes.append(f"{name} did not run: {failed[name]['error']}")
                    continue
                runs.setdefault(name, []).append(row)
        stats = vendor.stats()
    rows = {
        name: failed[name] if name in failed else median_run(runs[name])
        for name in names
        if name in failed or name in runs
    }
    figures: dict[str, Any] = {
        "tasks": tasks,
        "concurrency": QUOTA,
        "vendor_quota": QUOTA,
        "vendor_rate_limited": stats.get("rate_limited"),
        "budget_s": BATCH_BUDGET_S,
        "rounds": ROUNDS,
        "systems": rows,
    }
    return BenchResult(
        "batch",
        "Batch submission: 2,000 instant tasks in one batch",
        figures,
        batch_checks(rows, tasks),
        notes,
    )
