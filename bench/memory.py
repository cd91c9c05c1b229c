"""Benchmark 4: resident memory and store writes.

The service (`bench.service_child`: the service as `python -m dispatcher`
runs it, in its own process, so psutil's RSS is the service's alone) with
the `demo-chat-api` model against a demo vendor answering at once (quota 5).

1. RSS idle, two seconds after start.
2. The provider is switched off (the operator's switch), 10,000 tasks are
   submitted as ten jobs of 1,000, and RSS is read with all 10,000 pending.
3. The provider is switched on; the queue drains; RSS after draining, read
   after a full garbage collection in the service (see below).
4. Steps 2-3 four times more: the slope of RSS after each drain, from the
   third drain on, shows whether draining leaves memory behind (a leak
   grows it cycle by cycle). The first three cycles are the warm-up: they
   fill what is bounded on purpose, and the run says so in its target.

What fills, measured with `bench.memdiag` (10 cycles of 4,000 tasks, the
child's allocator figures after each drain; 2026-12-02): Python's live
blocks and pymalloc's bytes grow over the first ~12,000 tasks (the write
counter below fills to its 10,000-20,000 ids) and are flat after that
(+/-0.2 MB as the counter rotates); SQLite's own memory is flat at 2.4 MB
(its page cache) from the first drain; glibc's heap takes one step of about
2 MB free space plus a 1.9 MB block between 24,000 and 28,000 tasks, and is
flat again to 40,000. With 10,000-task cycles that step falls between the
second and the third drain, which is where the figures of record read 92,
then 95 MB. So growth is read from the third drain, over three drains.

RSS is read after a full collection (`ServiceProc.forget_child_stats`):
reference cycles wait for the collector's oldest generation, which runs
only once it has grown by a quarter, so a reading at an arbitrary moment
carries 1-2 MB of garbage or not, at random. Garbage cannot leak, and what
a leak keeps is reachable, so the collection hides no leak; the reading
before it is kept beside it (`rss_after_drain_before_gc_mb`).

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
import itertools
import math
import os
import statistics
import time
from dataclasses import dataclass
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
# The smallest cycle after the warm-up that a slow run shrinks to: fewer
# tasks and RSS's +/-1 MB wander swamps a slope per 10,000.
MIN_CYCLE_TASKS = 4_000
# Growth is read from the third drain (the last of the warm-up: see the
# module's docstring for what fills until then) to the last: five cycles are
# the fewest that leave three drains for the slope. More for a longer look:
# BENCH_MEMORY_CYCLES=10 (the budget grows with them).
CYCLES = int(os.environ.get("BENCH_MEMORY_CYCLES", "5"))
# At most this many more when the growth read is over the tolerance (see
# `another_cycle`), within the same budget.
EXTRA_CYCLES = 2
WARM_CYCLES = 3
QUOTA = 5
MODEL = "demo-chat-api"
PROVIDER = "demo"
TARGET_PENDING_MB = 200.0
# RSS after a drain wanders by about +/-1 MB from one cycle to the next
# (allocator and SQLite page cache; an 8-cycle run here read 68, 70, 70, 71,
# 70, 69, 70, 71 MB), so growth is the least-squares slope over the drains
# after the warm ones: a leak of 50 bytes per task shows as 0.5 MB per cycle.
GROWTH_TOLERANCE_MB_PER_CYCLE = 0.5
# Its own run (`python -m bench memory`: out of `make bench`, whose ten
# minutes it broke on slow VMs), with room for both extra cycles on a slow
# VM: a cycle is ~26 s on a quiet machine, ~28 s where dispatch ran 326
# tasks/s (the quiet run of 2026-12-04 read a one-off step of 1 MB at its
# fifth drain, flat from there to 70,000 tasks in `bench.memdiag`: the extra
# cycle tells a step from a slope). BENCH_MEMORY_BUDGET_S for a longer look.
BUDGET_S = float(os.environ.get("BENCH_MEMORY_BUDGET_S", 50.0 * CYCLES))
# A cycle is planned at the last one's pace per task times this: a drain's
# pace varies by 10-15 % from one cycle to the next.
PACE_MARGIN = 1.25


# A reading waits this long after what it follows (start-up: 2 s), for the
# service's last writes and answers of it to end; each cycle reads twice. 2 s
# each read the same as 1 s, cycle by cycle, within 0.6 MB (two runs of
# 2026-12-06).
SETTLE_S = 1.0


async def _settle(service: ServiceProc, seconds: float = SETTLE_S) -> float:
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
        job = answer.json()
        # A job of more than 500 tasks answers without them: they come in pages.
        cursor = ""
        while not job["tasks_included"]:
            page = (
                await call(client, "GET", f"/v1/jobs/{job['id']}/tasks?limit=500&cursor={cursor}")
            ).json()
            ids += [t["id"] for t in page["items"]]
            if page["next"] is None:
                break
            cursor = page["next"]
        ids += [t["id"] for t in job.get("tasks") or []]
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


@dataclass(frozen=True)
class CycleSize:
    tasks: int
    why: str = ""  # why it is smaller than a full cycle, or skipped


def cycle_size(
    cycle: int, tasks: int, done: list[dict[str, Any]], left_s: float, cycles: int = CYCLES
) -> CycleSize:
    """How many tasks cycle `cycle` (from 0) submits in the `left_s` the budget leaves.

    The time left is planned for all the cycles still to run, not spent by
    this one: a slow run (a loaded machine) that gave its fourth cycle all
    the time left had none for the fifth, and growth needs both. The
    warm-up cycles are full or nothing (they fill what is bounded on
    purpose), and run only when the time left also covers the cycles after
    them at `MIN_CYCLE_TASKS` each; those then share what is left equally,
    at the pace the cycles so far kept, down to `MIN_CYCLE_TASKS` (fewer, and
    RSS's wander swamps the slope). A cycle that cannot run says why.
    """
    if not done:
        return CycleSize(tasks)
    last = done[-1]
    if not last["drained"]:
        return CycleSize(0, f"cycle {cycle} did not drain within the budget")
    # Submit, drain and the two settles, per task, over every cycle so far: a
    # loaded machine's pace comes and goes (one run drained at 460, then 219
    # tasks/s), and the last cycle alone gave up on a run that had the time.
    spent_s = sum(c["submit_s"] + c["drain_s"] + 4.0 for c in done)
    submitted = max(1, sum(c["submitted"] for c in done))
    covered = int(left_s / (spent_s / submitted * PACE_MARGIN))
    pace = f"{submitted / (spent_s - 4.0 * len(done)):.0f} tasks/s"
    measured = max(0, cycles - max(cycle, WARM_CYCLES))  # the cycles after the warm-up left
    if cycle < WARM_CYCLES:
        warm = (WARM_CYCLES - cycle) * tasks
        needed = warm + measured * MIN_CYCLE_TASKS
        if covered >= needed:
            return CycleSize(tasks)
        return CycleSize(
            0,
            f"the warm-up's {warm:,} tasks left and {measured} cycles of at least "
            f"{MIN_CYCLE_TASKS:,} after it need {needed:,}; at {pace} the {left_s:.0f} s "
            f"left of the budget cover {covered:,} (BENCH_MEMORY_BUDGET_S gives more)",
        )
    share = min(tasks, covered // max(1, measured) // CHUNK * CHUNK)
    if share >= tasks:
        return CycleSize(tasks)
    if share < MIN_CYCLE_TASKS:
        return CycleSize(
            0,
            f"at {pace} the {left_s:.0f} s left cover {covered:,} tasks, fewer than "
            f"{max(1, measured)} cycles of {MIN_CYCLE_TASKS:,}",
        )
    return CycleSize(
        share,
        f"{share:,} tasks: the {left_s:.0f} s left shared by {max(1, measured)} cycles at {pace}",
    )


def another_cycle(cycle_figures: list[dict[str, Any]], tasks: int, window: int) -> str:
    """Why one more cycle after the planned ones, or "" for none: growth read
    over the tolerance may be a one-off step (the allocator's, finding 9)
    rather than a slope, and one more drain tells them apart; a leak keeps
    growing. The budget still decides whether it fits."""
    growth = growth_per_cycle(cycle_figures, tasks, window)
    if not growth > GROWTH_TOLERANCE_MB_PER_CYCLE:
        return ""
    return (
        f"growth read {growth:+.2f} MB per {tasks:,} tasks over {len(cycle_figures)} drains: "
        "one more cycle, to tell a one-off step from a slope"
    )


def growth_per_cycle(
    cycle_figures: list[dict[str, Any]], tasks: int, window: int | None = None
) -> float:
    """MB per `tasks` tasks: the least-squares slope of RSS after each drain
    against the tasks run so far, from the last warm-up drain on (cycles may
    differ in size when a slow run shrank them), over the last `window`
    drains when given (extra cycles slide it past a one-off step; a leak
    grows in any window); nan with fewer than 3 drains."""
    done = list(itertools.accumulate(c["submitted"] for c in cycle_figures))
    pairs = list(zip(done, cycle_figures, strict=True))[WARM_CYCLES - 1 :]
    if window is not None:
        pairs = pairs[-window:]
    if len(pairs) < 3:
        return math.nan
    return statistics.linear_regression(
        [n / tasks for n, _ in pairs], [c["rss_after_drain_mb"] for _, c in pairs]
    ).slope


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
    window = cycles - WARM_CYCLES + 1  # the drains growth is read over
    with Vendor(time_scale=1.0, quota=QUOTA) as vendor:
        env = service_env(profiles, vendor.url, time_scale=1.0, concurrency={PROVIDER: QUOTA})
        with ServiceProc(work / "state", env, work / "service.log", "bench.service_child") as svc:
            idle = await _settle(svc, 2.0)
            async with svc.async_client(limit=4, timeout_s=300) as client:
                for cycle in range(cycles + EXTRA_CYCLES):
                    if cycle >= cycles:
                        why = another_cycle(cycle_figures, tasks, window)
                        if not why:
                            break
                        notes.append(why)
                    left = budget_s - (time.monotonic() - started)
                    size = cycle_size(cycle, tasks, cycle_figures, left, cycles)
                    if size.tasks == 0:
                        notes.append(f"cycle {cycle + 1} skipped: {size.why}")
                        break
                    if size.why:
                        notes.append(f"cycle {cycle + 1}: {size.why}")
                    off = await call(
                        client,
                        "POST",
                        f"/v1/accounts/{PROVIDER}/disable",
                        json={"reason": "benchmark: hold the queue"},
                    )
                    off.raise_for_status()
                    ids, submit_s = await _submit(client, size.tasks, cycle)
                    pending = await _settle(svc)
                    lanes = (await call(client, "GET", "/v1/lanes")).json()
                    queued = sum(lane["queued"] for lane in lanes)
                    on = await call(client, "POST", f"/v1/accounts/{PROVIDER}/enable")
                    on.raise_for_status()
                    left = budget_s - (time.monotonic() - started)
                    drain = await _drain(svc, client, len(ids), timeout_s=max(30.0, left))
                    before_gc = await _settle(svc)
                    # Audited cycle by cycle: the service keeps write counts for
                    # its recent tasks only, and the child's own event counts
                    # must not pile up as if the service leaked them.
                    counters = svc.child_stats()
                    writes += [counters["writes"].get(i, 0) for i in ids]
                    transitions += [counters["transitions"].get(i, 0) for i in ids]
                    del counters
                    svc.forget_child_stats()  # and a full collection: see the docstring
                    after = svc.rss_mb()
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
                            "rss_after_drain_before_gc_mb": r(before_gc, 1),
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
    growth = growth_per_cycle(cycle_figures, tasks, window)
    figures: dict[str, Any] = {
        "tasks_per_cycle": tasks,
        "cycles": done_cycles,
        "rss_idle_mb": r(idle, 1),
        "by_cycle": cycle_figures,
        "rss_growth_per_cycle_mb": r(growth, 3),  # slope from the last warm drain on
        "warm_cycles": WARM_CYCLES,
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
            f"none (slope over the last {window} drains, after a warm-up of "
            f"{WARM_CYCLES * tasks:,} tasks that fills bounded caches; "
            f"<= {GROWTH_TOLERANCE_MB_PER_CYCLE:g} MB per {tasks:,} tasks)",
            f"{growth:+.2f} MB per {tasks:,} tasks (after drains, each after a full "
            "collection: "
            + ", ".join(
                f"{c['rss_after_drain_mb']:.0f}"
                + ("" if c["submitted"] == tasks else f" after {c['submitted']:,}")
                for c in cycle_figures
            )
            + " MB)"
            if done_cycles > WARM_CYCLES + 1 and all(c["drained"] for c in cycle_figures)
            else "could not measure: " + "; ".join(notes),
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
