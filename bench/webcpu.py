"""Where a web task's CPU goes: a diagnostic for benchmark 9 (not a benchmark).

`python -m bench.webcpu [ACCOUNTS] [TASKS]` runs benchmark 9's setup (the
real service, `demo-chat` on ACCOUNTS accounts logged into the demo web
model, their browsers started as the lanes open) and reads the CPU time
(user + system) of every process involved, by kind: the service (Python),
the Playwright driver (node), each Chromium's browser, renderer, GPU and
utility processes, and the demo web server. Two windows:

- idle: the browsers up and kept, no task, for `IDLE_S`;
- batch: TASKS web tasks of 3-6 s (benchmark 9's seed), submitted as one job.

Processes come and go (a tab's renderer ends with it), so each process is
read every `SAMPLE_S` and its last reading kept. Prints CPU seconds per kind
per window, per second (idle) and per task (batch), and the load average.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import psutil

from bench.accounts import (
    BUDGET_MB,
    KEEP_ALIVE_S,
    MODEL,
    _browsers_ready,
    login_all,
    plan,
)
from bench.common import DemoProc, ServiceProc, call, copy_profile, fresh_dir, r

IDLE_S = 10.0
SAMPLE_S = 0.5


def kind_of(proc: psutil.Process, service_pid: int, demo_pid: int) -> str:
    if proc.pid == service_pid:
        return "service"
    if proc.pid == demo_pid:
        return "demo-web"
    try:
        cmdline = proc.cmdline()
    except psutil.Error:
        return "?"
    for arg in cmdline:
        if arg.startswith("--type="):
            kind = arg.split("=", 1)[1]
            for sub in cmdline:
                if sub.startswith("--utility-sub-type="):
                    return f"chromium-{kind}:{sub.split('=', 1)[1].split('.')[-1]}"
            return f"chromium-{kind}"
    name = Path(cmdline[0]).name if cmdline else proc.name()
    if "node" in name:
        return "driver"
    if "chrom" in name:
        return "chromium-browser"
    return name


class CpuWatch:
    """The CPU time of every process of the service's tree and the demo, by kind."""

    def __init__(self, service_pid: int, demo_pid: int) -> None:
        self.service_pid = service_pid
        self.demo_pid = demo_pid
        # (pid, create time) -> (kind, cpu seconds at the last reading)
        self.seen: dict[tuple[int, float], tuple[str, float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._lock = threading.Lock()

    def read(self) -> None:
        try:
            root = psutil.Process(self.service_pid)
            procs = [root, *root.children(recursive=True), psutil.Process(self.demo_pid)]
        except psutil.Error:
            return
        for proc in procs:
            try:
                key = (proc.pid, proc.create_time())
                t = proc.cpu_times()
                cpu = t.user + t.system
                with self._lock:
                    kind = self.seen[key][0] if key in self.seen else None
                if kind is None:
                    kind = kind_of(proc, self.service_pid, self.demo_pid)
                with self._lock:
                    self.seen[key] = (kind, cpu)
            except psutil.Error:
                continue

    def by_kind(self) -> dict[str, float]:
        out: dict[str, float] = defaultdict(float)
        with self._lock:
            for kind, cpu in self.seen.values():
                out[kind] += cpu
        return dict(out)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        with self._lock:
            for kind, _ in self.seen.values():
                out[kind] += 1
        return dict(out)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.read()
            self._stop.wait(SAMPLE_S)

    def __enter__(self) -> CpuWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.read()


def diff(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before.get(k, 0.0) for k in sorted(after)}


async def main(accounts_n: int, tasks_n: int, work: Path) -> dict[str, Any]:
    from dispatcher.settings import find_browser

    browser = find_browser()
    assert browser is not None
    accounts = tuple(f"acct-{i:02d}" for i in range(1, accounts_n + 1))
    import bench.accounts as acc

    acc.ACCOUNTS = accounts  # login_all and _browsers_ready read it
    work = fresh_dir(work)
    nominal = plan()[:tasks_n]
    scale = acc.TARGET_LB_S / (sum(plan()) / 20)
    profiles = work / "profiles"
    listed = ", ".join(f'"{a}"' for a in accounts)
    copy_profile(
        profiles, MODEL, replace={'accounts = ["demo-1", "demo-2"]': f"accounts = [{listed}]"}
    )
    state = work / "state"
    state.mkdir(mode=0o700, parents=True)
    with DemoProc("web", scale) as web:
        await login_all(browser, state, web.url)
        env = {
            "DISPATCHER_PROFILES_DIR": str(profiles),
            "DISPATCHER_TIME_SCALE": repr(scale),
            "DISPATCHER_BROWSER_EXECUTABLE": browser,
            "DISPATCHER_BROWSER_MEMORY_MB": str(BUDGET_MB),
            "DISPATCHER_BROWSER_KEEP_ALIVE_S": str(KEEP_ALIVE_S),
            "DEMO_WEB_URL": web.url,
        }
        module = os.environ.get("WEBCPU_MODULE", "bench.service_child")
        with ServiceProc(state, env, work / "service.log", module=module) as service:
            await _browsers_ready(service)
            await asyncio.sleep(3.0)  # the last prime settles
            with CpuWatch(service.pid, web.popen.pid) as watch:
                watch.read()
                idle0, t0 = watch.by_kind(), time.monotonic()
                await asyncio.sleep(IDLE_S)
                watch.read()
                idle1, t1 = watch.by_kind(), time.monotonic()
                load_idle = os.getloadavg()[0]
                tasks = [
                    {
                        "model": MODEL,
                        "params": {"prompt": f"cpu #{i} [duration={d:.3f}]"},
                        "force": True,
                    }
                    for i, d in enumerate(nominal)
                ]
                async with service.async_client(limit=2, timeout_s=120.0) as client:
                    answer = await call(
                        client, "POST", "/v1/jobs", json={"name": "cpu", "tasks": tasks}
                    )
                    job_id = answer.json()["id"]
                    while True:
                        await asyncio.sleep(0.5)
                        path = f"/v1/jobs/{job_id}?tasks=none"
                        job = (await call(client, "GET", path)).json()
                        if job["state"] != "running":
                            break
                    job = (await call(client, "GET", f"/v1/jobs/{job_id}")).json()
                watch.read()
                batch1, t2 = watch.by_kind(), time.monotonic()
                load_batch = os.getloadavg()[0]
            counts = watch.counts()
            rows = list(job["tasks"])
        stats = web.stats()
    gen_real = [d * scale for d in nominal]
    over = [
        row["finished_at"] - row["started_at"] - g
        for row, g in zip(rows, gen_real, strict=True)
        if row["state"] == "success" and row.get("started_at")
    ]
    idle = diff(idle1, idle0)
    batch = diff(batch1, idle1)
    t_first = min(row["created_at"] for row in rows)
    t_last = max(row["finished_at"] or 0 for row in rows)
    return {
        "accounts": accounts_n,
        "tasks": tasks_n,
        "succeeded": sum(row["state"] == "success" for row in rows),
        "collisions": stats.get("collisions"),
        "idle_s": r(t1 - t0, 1),
        "idle_cpu_per_s": {k: r(v / (t1 - t0), 3) for k, v in idle.items()},
        "idle_cpu_per_s_total": r(sum(idle.values()) / (t1 - t0), 3),
        "batch_s": r(t2 - t1, 1),
        "makespan_s": r(t_last - t_first, 2),
        "gen_sum_s": r(sum(gen_real), 1),
        "lb_even_s": r(sum(gen_real) / accounts_n, 1),
        "batch_cpu_per_task_s": {k: r(v / tasks_n, 3) for k, v in batch.items()},
        "batch_cpu_per_task_total_s": r(sum(batch.values()) / tasks_n, 3),
        "batch_cpu_per_s": r(sum(batch.values()) / (t2 - t1), 2),
        "overhead_mean_s": r(sum(over) / max(1, len(over)), 3),
        "processes_by_kind": counts,
        "load_idle": r(load_idle, 2),
        "load_batch": r(load_batch, 2),
    }


if __name__ == "__main__":
    n_accounts = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    n_tasks = int(sys.argv[2]) if len(sys.argv) > 2 else 100
    out = asyncio.run(main(n_accounts, n_tasks, Path("/tmp/webcpu-web31")))
    print(json.dumps(out, indent=1))
