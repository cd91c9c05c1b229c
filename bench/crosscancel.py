"""Part of benchmark 6: a cancel asked on one host, reaching the host that runs the task.

docs/several-hosts.md promises it within a second: the cancel's write sends
a notice, and the running host, hearing it, interrupts the run (its next
heartbeat, 15 s away, is the fallback for a lost notice). The tests check
which path delivers it; how fast is a figure of the machine, so it is
measured here, on a quiet run.

Two services (`runner` and `asker`, `bench.service_child`) on a fresh
database, both serving the instant chat model. `CANCELS` times, one after
another: a task of `SLOW_GEN_S` submitted to `runner` (claimed in its
insert's transaction: a free slot), then, once it runs, its cancel asked of
`asker` by `POST /v1/tasks/{id}/cancel`. The time is from sending that
request to hearing `runner`'s write of the task canceled, on a LISTEN
connection of this process's own (the same notices the hosts hear). Target:
the slowest of them within `CANCEL_WITHIN_S`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

import httpx
import psycopg

from bench.common import ServiceProc, Vendor, fresh_dir, percentile, profiles_dir, r, service_env
from bench.dispatch import MODEL
from dispatcher.store.pglisten import CHANNEL
from dispatcher.store.pgnotice import parse_notice

CANCELS = 50
SLOW_GEN_S = 600
CANCEL_WITHIN_S = 1.0
STEP_TIMEOUT_S = 20.0


class _Heard:
    """Which (task, state) the task notices have said: when first (monotonic),
    and the host whose write it was."""

    def __init__(self) -> None:
        self.first: dict[tuple[str, str], tuple[float, str]] = {}
        self._changed = asyncio.Event()

    def note(self, payload: str) -> None:
        notice = parse_notice(payload)
        if notice is not None:
            key = (notice.task_id, notice.state)
            self.first.setdefault(key, (time.monotonic(), notice.origin))
            self._changed.set()

    async def wait(self, task_id: str, state: str) -> tuple[float, str]:
        """(when, writing host) of the task's first notice in `state`."""
        async with asyncio.timeout(STEP_TIMEOUT_S):
            while (task_id, state) not in self.first:
                self._changed.clear()
                await self._changed.wait()
        return self.first[task_id, state]


async def _listen(url: str, heard: _Heard) -> None:
    # Not the hosts' `TaskListener`: it reads its socket every 25 ms
    # (`READ_EVERY_S`), most of the figure measured here; this one as each arrives.
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute(f"LISTEN {CHANNEL}")
        async for notify in conn.notifies():
            heard.note(notify.payload)


async def _one_cancel(runner: httpx.AsyncClient, asker: httpx.AsyncClient, heard: _Heard) -> float:
    body = {"model": MODEL, "params": {"prompt": "a long answer", "gen_s": SLOW_GEN_S}}
    response = await runner.post("/v1/tasks", json=body)
    response.raise_for_status()
    task_id = str(response.json()["id"])
    _, claimed_by = await heard.wait(task_id, "running")
    assert claimed_by == "runner", f"the task ran on {claimed_by!r}, not across hosts"
    asked = time.monotonic()
    response = await asker.post(f"/v1/tasks/{task_id}/cancel")
    response.raise_for_status()
    canceled_at, _ = await heard.wait(task_id, "canceled")
    return canceled_at - asked


async def cancel_latency(work: Path, url: str) -> dict[str, Any]:
    """`CANCELS` cross-host cancels, one at a time: seconds each took."""
    work = fresh_dir(work / "crosscancel")
    profiles = profiles_dir(work / "profiles", [MODEL])
    heard = _Heard()
    with Vendor(time_scale=1.0, quota=5) as vendor:
        env = service_env(profiles, vendor.url, time_scale=1.0, concurrency={"demo": 5})
        env |= {"DISPATCHER_DATABASE_URL": url}
        with (
            ServiceProc(
                work / "runner",
                env | {"DISPATCHER_HOST_ID": "runner"},
                work / "runner.log",
                "bench.service_child",
            ) as runner_svc,
            ServiceProc(
                work / "asker",
                env | {"DISPATCHER_HOST_ID": "asker"},
                work / "asker.log",
                "bench.service_child",
            ) as asker_svc,
        ):
            listening = asyncio.create_task(_listen(url, heard))
            try:
                async with runner_svc.async_client() as runner, asker_svc.async_client() as asker:
                    await asyncio.sleep(0.5)  # LISTEN in place
                    took = [await _one_cancel(runner, asker, heard) for _ in range(CANCELS)]
            finally:
                listening.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await listening
    return {
        "cancels": len(took),
        "p50_s": r(percentile(took, 50), 3),
        "max_s": r(max(took), 3),
        "within_s": CANCEL_WITHIN_S,
        "met": max(took) <= CANCEL_WITHIN_S,
    }
