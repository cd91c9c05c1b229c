"""Part of benchmark 6: what another host's task notice costs a listening host.

Every write of a task on PostgreSQL sends a notice, and every host hears
every other host's: on N hosts each hears (N - 1) / N of the cluster's
writes, so this cost per notice is what caps a cluster's rate on each host.

One service (`bench.service_child`, host `listener`, serving the instant
chat model) on a fresh database, idle; a second store in this process
(host `writer`) makes `NOTICE_TASKS_PER_S` tasks a second of the same model
for `NOTICE_S`: each inserted and claimed in one transaction (as a host
with a free slot does: never pending for the listener to claim) and ended,
three notices a task in two commits, written by the real trigger. Figures:
the listener's CPU per notice (its CPU over the window less its idle rate,
the lower of its rates just before and just after), and the CPU of its
listening connection's backend on the server. The listener's CPU is the
scheduler's own account (`common.on_cpu_s`, nanoseconds): in clock ticks
(10 ms), its idle seconds' blips outweighed the ~120 ms the notices cost.
A window whose figure is still not above zero is measured again, up to
`ATTEMPTS` times, and then reported as not measured, with why. No target:
reported, and the figure quoted by docs/several-hosts.md.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import psycopg

from bench.common import (
    PG_ADMIN,
    ServiceProc,
    Vendor,
    fresh_dir,
    on_cpu_s,
    profiles_dir,
    r,
    service_env,
)
from bench.dispatch import MODEL
from dispatcher.models import Kind, State, Task
from dispatcher.store import NextClaim, open_store
from dispatcher.store.pglisten import listener_name

NOTICE_TASKS_PER_S = 150.0
NOTICE_S = 4.0
IDLE_S = 2.0
ATTEMPTS = 3


def _listener_backend(url: str, host: str) -> int:
    """The pid of the server process serving `host`'s listening connection."""
    with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
        row = admin.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s",
            (listener_name(host),),
        ).fetchone()
    if row is None:
        raise RuntimeError(f"no listening connection of host {host!r} on the server")
    return int(row[0])


async def _write_tasks(url: str, attempt: int) -> int:
    """Tasks made, claimed and ended by another host at the set rate; notices sent."""
    writer = await open_store(url, "writer")
    sent = 0
    try:
        start = time.monotonic()
        n = 0
        while time.monotonic() - start < NOTICE_S:
            n += 1
            task = Task(
                id=f"n{attempt}-{n:06d}",
                model=MODEL,
                kind=Kind.API,
                queue=f"api-model:{MODEL}",
                params={"prompt": f"notice {n}", "gen_s": 0},
                fingerprint=f"notice-{attempt}-{n}",
                created_at=time.time(),
            )
            # Claimed in the insert's transaction (`tasks/submitclaim.py`): a
            # task the listener claimed and ran was counted as notices' CPU.
            now = time.time()
            both = await writer.insert_and_claim(
                task, now - 30, NextClaim((task.queue,), now, {"owner": "demo", "host": "writer"})
            )
            assert both is not None and both.claimed is not None, "the writer claims its task"
            sent += 2
            await writer.update_task(
                both.claimed.id,
                expect_state=State.RUNNING,
                changes={"state": State.SUCCESS, "finished_at": time.time()},
            )
            sent += 1
            due = start + n / NOTICE_TASKS_PER_S
            await asyncio.sleep(max(0.0, due - time.monotonic()))
    finally:
        await writer.close()
    return sent


async def notice_cost(work: Path, url: str) -> dict[str, Any]:
    work = fresh_dir(work / "notices")
    profiles = profiles_dir(work / "profiles", [MODEL])
    with Vendor(time_scale=1.0, quota=5) as vendor:
        env = service_env(profiles, vendor.url, time_scale=1.0, concurrency={"demo": 5})
        env |= {"DISPATCHER_HOST_ID": "listener", "DISPATCHER_DATABASE_URL": url}
        with ServiceProc(work / "state", env, work / "listener.log", "bench.service_child") as svc:
            backend = await asyncio.to_thread(_listener_backend, url, "listener")
            for attempt in range(1, ATTEMPTS + 1):
                idle_before = await _idle_rate(svc.pid)
                cpu0, backend0, t0 = on_cpu_s(svc.pid), on_cpu_s(backend), time.monotonic()
                sent = await _write_tasks(url, attempt)
                await asyncio.sleep(0.5)  # the last notices heard
                wall = time.monotonic() - t0
                used = on_cpu_s(svc.pid) - cpu0
                backend_cpu = on_cpu_s(backend) - backend0
                # The quieter of the two: a blip of the service's own (a heartbeat) in
                # one idle window would be taken for all of the notices' window.
                idle_rate = min(idle_before, await _idle_rate(svc.pid))
                cpu = used - idle_rate * wall
                if cpu > 0:
                    break
    measured = cpu > 0
    return {
        "notices": sent,
        "listener_cpu_us_per_notice": r(cpu * 1e6 / max(1, sent), 1) if measured else None,
        "listener_backend_cpu_us_per_notice": r(backend_cpu * 1e6 / max(1, sent), 1),
        "idle_cpu_ms_per_s": r(idle_rate * 1000, 2),
        "attempts": attempt,
        "not_measured": None
        if measured
        else f"the listener's idle CPU ({r(idle_rate * 1000, 2)} ms/s) outweighed the "
        f"notices' in each of {ATTEMPTS} windows",
    }


async def _idle_rate(pid: int) -> float:
    """The process's CPU seconds a second over `IDLE_S` with nothing sent."""
    before = on_cpu_s(pid)
    await asyncio.sleep(IDLE_S)
    return (on_cpu_s(pid) - before) / IDLE_S
