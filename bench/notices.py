"""Part of benchmark 6: what another host's task notice costs a listening host.

Every write of a task on PostgreSQL sends a notice, and every host hears
every other host's: on N hosts each hears (N - 1) / N of the cluster's
writes, so this cost per notice is what caps a cluster's rate on each host.

One service (`bench.service_child`, host `listener`, serving the instant
chat model) on a fresh database, idle; a second store in this process
(host `writer`) makes `NOTICE_TASKS_PER_S` tasks a second of the same model
for `NOTICE_S`: each inserted, claimed at once (before the listener's 0.1 s
grace for another host's new task ends, as a host with a free slot does)
and ended, three notices a task, each its own commit, written by the real
trigger. Figures: the listener's CPU per notice (its CPU over the window
less its idle rate), and the CPU of its listening connection's backend on
the server. No target: reported, and the figure quoted by docs/several-hosts.md.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import psutil
import psycopg

from bench.common import (
    PG_ADMIN,
    ServiceProc,
    Vendor,
    cpu_of,
    fresh_dir,
    profiles_dir,
    r,
    service_env,
)
from bench.dispatch import MODEL
from dispatcher.models import Kind, State, Task
from dispatcher.store import open_store
from dispatcher.store.pglisten import listener_name

NOTICE_TASKS_PER_S = 150.0
NOTICE_S = 4.0
IDLE_S = 2.0


def _listener_backend(url: str, host: str) -> psutil.Process | None:
    with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
        row = admin.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s",
            (listener_name(host),),
        ).fetchone()
    return psutil.Process(int(row[0])) if row else None


async def _write_tasks(url: str) -> int:
    """Tasks made, claimed and ended by another host at the set rate; notices sent."""
    writer = await open_store(url, "writer")
    sent = 0
    try:
        start = time.monotonic()
        n = 0
        while time.monotonic() - start < NOTICE_S:
            n += 1
            task = Task(
                id=f"n{n:06d}",
                model=MODEL,
                kind=Kind.API,
                queue=f"api-model:{MODEL}",
                params={"prompt": f"notice {n}", "gen_s": 0},
                fingerprint=f"notice-{n}",
                created_at=time.time(),
            )
            await writer.insert_tasks([task])
            sent += 1
            claimed = await writer.claim_next(
                [task.queue], time.time(), {"owner": "demo", "host": "writer"}
            )
            if claimed is not None:
                sent += 1
                await writer.update_task(
                    claimed.id,
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
            idle0 = svc.cpu_s()
            await asyncio.sleep(IDLE_S)
            idle_rate = (svc.cpu_s() - idle0) / IDLE_S
            backends = [backend] if backend is not None else []
            cpu0, backend0, t0 = svc.cpu_s(), cpu_of(backends), time.monotonic()
            sent = await _write_tasks(url)
            await asyncio.sleep(0.5)  # the last notices heard
            wall = time.monotonic() - t0
            cpu = svc.cpu_s() - cpu0 - idle_rate * wall
            backend_cpu = cpu_of(backends) - backend0
    return {
        "notices": sent,
        "listener_cpu_us_per_notice": r(max(0.0, cpu) * 1e6 / max(1, sent), 1),
        "listener_backend_cpu_us_per_notice": r(backend_cpu * 1e6 / max(1, sent), 1),
        "idle_cpu_ms_per_s": r(idle_rate * 1000, 2),
    }
