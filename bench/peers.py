"""Benchmark 5: the same 2,000 instant tasks through the task queues a user
would otherwise pick, and through the dispatcher, in one run.

Every system runs one job per task: one POST to the demo vendor's chat
endpoint (its own process, quota 5, answering at once) with httpx, written
as that library's users write it (`bench/peer_apps/`), its worker started
with the library's own command line at concurrency 5, tasks enqueued one by
one from this one client process, against the Redis and PostgreSQL servers
on loopback. The dispatcher's lane is benchmark 3 (`POST /v1/tasks`,
SQLite): its result from the same `python -m bench`, or run here when
benchmark 5 runs alone, so every row comes from the same run.

Per system: tasks/s = tasks / (last completion - first enqueue), the
completion times from the system's own records (arq's `finish_time`, RQ's
`ended_at`, Celery's `date_done`, procrastinate's `succeeded` event; Dramatiq
keeps none, so its job returns the time, stored by its Results backend);
submit-to-done p50/p99 (enqueue call on the client to that completion); CPU
seconds per task of the worker processes (and their reaped children: RQ
forks one per job) plus the broker (the redis-server process, or the
PostgreSQL backends of our own database); the workers' peak RSS (sampled
every 0.1 s). Redis is shared with whoever else uses it: its CPU figure is
that process's delta over the run. Each system is bounded by
`PEER_BUDGET_S`; one that does not finish says how many tasks it did.
"""

from __future__ import annotations

import asyncio
import gc
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import psutil

from bench import dispatch
from bench.common import (
    PG_ADMIN,
    REPO,
    BenchResult,
    Check,
    PeakRss,
    Vendor,
    cpu_calibration,
    cpu_of,
    fresh_dir,
    percentile,
    process_tree,
    r,
)
from bench.peer_apps import CONCURRENCY, QUEUE

TASKS = 2000
QUOTA = 5
REDIS_URL = "redis://127.0.0.1:6379/11"
# Enough for 2,000 tasks at 200/s (the fast peers run 650/s on a quiet
# machine); slower peers (arq, RQ: ~30/s) are cut off and reported with the
# tasks they did, at the rate they kept. `make bench` has ten minutes.
PEER_BUDGET_S = 8.0
WARM_UP_BUDGET_S = 60.0
BIN = Path(sys.executable).parent


# -- measuring processes ---------------------------------------------------------
def redis_server() -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["name"]) if p.info["name"] == "redis-server"]


def pg_backends(database: str) -> list[psutil.Process]:
    """The PostgreSQL backends serving our database (their title names it)."""
    found = []
    for proc in psutil.process_iter(["name", "cmdline"]):
        cmd = " ".join(proc.info["cmdline"] or [])
        if proc.info["name"] == "postgres" and f" {database} " in f"{cmd} ":
            found.append(proc)
    return found


# -- one system ----------------------------------------------------------------------
@dataclass
class Lane:
    """What a peer's client side does: warm up, enqueue, wait, read the records."""

    name: str
    package: str
    worker: Callable[[dict[str, str]], list[str]]
    broker: str  # "redis" or "postgres"
    submits: list[float] = field(default_factory=list)
    finishes: dict[int, float] = field(default_factory=dict)  # task index -> done at
    note: str = ""
    # Called by the client just before its first enqueue: the worker's CPU
    # until then (start-up, imports, the warm-up job) is not the batch's.
    on_first_enqueue: Callable[[], None] = lambda: None
    batch_call_s: float | None = None

    def batch_submitted(self, start: float, tasks: int) -> None:
        """The whole batch was handed over in one call begun at `start`:
        every task's latency counts from there, as its submitter sees it."""
        self.batch_call_s = time.time() - start
        self.submits = [start] * tasks


def _utc(value: datetime) -> float:
    return (value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp()


async def _until(done: Callable[[], bool], budget_s: float, period_s: float = 0.1) -> bool:
    deadline = time.monotonic() + budget_s
    while not done():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(period_s)
    return True


async def run_arq(lane: Lane, tasks: int, budget_s: float, dsn: str, batch: bool = False) -> None:
    from arq import create_pool
    from arq.connections import RedisSettings
    from arq.jobs import JobStatus

    redis = await create_pool(RedisSettings.from_dsn(REDIS_URL))
    try:
        warm = await redis.enqueue_job("call_vendor", -1)
        assert warm is not None
        await warm.result(timeout=WARM_UP_BUDGET_S, poll_delay=0.1)
        jobs = []
        lane.on_first_enqueue()
        start = time.time()
        for i in range(tasks):  # arq has no batch call: its users' batch is this loop
            lane.submits.append(time.time())
            jobs.append(await redis.enqueue_job("call_vendor", i))
        if batch:
            lane.batch_submitted(start, tasks)
        deadline = time.monotonic() + budget_s
        for job in jobs:
            assert job is not None
            while await job.status() is not JobStatus.complete:
                if time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.1)
        for i, job in enumerate(jobs):
            assert job is not None
            info = await job.result_info()
            if info is not None and info.success:
                lane.finishes[i] = _utc(info.finish_time)
    finally:
        await redis.aclose()


async def run_rq(lane: Lane, tasks: int, budget_s: float, dsn: str, batch: bool = False) -> None:
    from redis import Redis
    from rq import Queue
    from rq.job import Job

    from bench.peer_apps.rq_app import call_vendor

    conn = Redis.from_url(REDIS_URL)
    queue = Queue(QUEUE, connection=conn)
    warm = queue.enqueue(call_vendor, -1)
    await _until(lambda: warm.get_status() == "finished", WARM_UP_BUDGET_S)
    ids = []
    lane.on_first_enqueue()
    if batch:
        start = time.time()
        many = [Queue.prepare_data(call_vendor, args=(i,)) for i in range(tasks)]
        ids = [job.id for job in queue.enqueue_many(many)]
        lane.batch_submitted(start, tasks)
    for i in range(0 if batch else tasks):
        lane.submits.append(time.time())
        ids.append(queue.enqueue(call_vendor, i).id)
    registries = (queue.finished_job_registry, queue.failed_job_registry)
    await _until(lambda: sum(reg.count for reg in registries) > tasks, budget_s, 0.2)
    for i, job in enumerate(Job.fetch_many(ids, connection=conn)):
        if job is not None and job.get_status() == "finished" and job.ended_at is not None:
            lane.finishes[i] = _utc(job.ended_at)
    conn.close()


async def run_celery(
    lane: Lane, tasks: int, budget_s: float, dsn: str, batch: bool = False
) -> None:
    from bench.peer_apps.celery_app import app, call_vendor

    gc.collect()  # an earlier run's results, should any be left (see the end)
    call_vendor.delay(-1).get(timeout=WARM_UP_BUDGET_S)
    results = []
    lane.on_first_enqueue()
    if batch:
        from celery import group

        start = time.time()
        results = list(group(call_vendor.s(i) for i in range(tasks)).apply_async().results)
        lane.batch_submitted(start, tasks)
    for i in range(0 if batch else tasks):
        lane.submits.append(time.time())
        results.append(call_vendor.delay(i))
    await _until(lambda: all(res.ready() for res in results[-50:]), budget_s, 0.2)
    deadline = time.monotonic() + budget_s
    for i, res in enumerate(results):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            res.get(timeout=left)
        except Exception:  # a task that failed or did not finish: it has no date
            continue
        if res.date_done is not None:
            lane.finishes[i] = _utc(res.date_done)
    # A Celery result unsubscribes from Redis in its `__del__`. Left to the
    # garbage collector (results sit in reference cycles), one ran inside a
    # later run's own Redis command, on the same connection, and hung it for
    # good (`python -m bench`, batch round 2). Collected here, between commands.
    results.clear()
    gc.collect()
    app.close()


async def run_dramatiq(
    lane: Lane, tasks: int, budget_s: float, dsn: str, batch: bool = False
) -> None:
    from dramatiq.results import ResultTimeout

    from bench.peer_apps.dramatiq_app import broker, call_vendor

    call_vendor.send(-1).get_result(block=True, timeout=int(WARM_UP_BUDGET_S * 1000))
    messages: list[Any] = []
    lane.on_first_enqueue()
    if batch:
        from dramatiq import group

        start = time.time()
        batch_group = group(call_vendor.message(i) for i in range(tasks)).run()
        messages = list(batch_group.children)
        lane.batch_submitted(start, tasks)
    for i in range(0 if batch else tasks):
        lane.submits.append(time.time())
        messages.append(call_vendor.send(i))
    deadline = time.monotonic() + budget_s
    for i, message in enumerate(messages):
        left_ms = int((deadline - time.monotonic()) * 1000)
        if left_ms <= 0:
            break
        try:
            _text, finished = message.get_result(block=True, timeout=left_ms)
        except ResultTimeout:
            break
        lane.finishes[i] = float(finished)
    broker.close()


async def run_procrastinate(
    lane: Lane, tasks: int, budget_s: float, dsn: str, batch: bool = False
) -> None:
    import procrastinate
    import psycopg

    from bench.peer_apps.procrastinate_app import app, call_vendor

    def finished(conn: psycopg.Connection[Any]) -> int:
        row = conn.execute(
            "SELECT count(*) FROM procrastinate_jobs WHERE status IN ('succeeded', 'failed')"
        ).fetchone()
        return int(row[0]) if row else 0

    # The app's connector was built at import from the first run's database
    # (dropped after it): a second run in one process (5 then 7) timed out
    # opening its pool against it. Each run connects to its own database.
    connector = procrastinate.PsycopgConnector(conninfo=dsn)
    with psycopg.connect(dsn, autocommit=True) as conn, app.replace_connector(connector):
        with app.open():
            call_vendor.defer(i=-1)
            await _until(lambda: finished(conn) >= 1, WARM_UP_BUDGET_S)
            lane.on_first_enqueue()
            if batch:
                start = time.time()
                every: list[dict[str, Any]] = [{"i": i} for i in range(tasks)]
                call_vendor.batch_defer(*every)
                lane.batch_submitted(start, tasks)
            for i in range(0 if batch else tasks):
                lane.submits.append(time.time())
                call_vendor.defer(i=i)
        await _until(lambda: finished(conn) > tasks, budget_s, 0.2)
        rows = conn.execute(
            "SELECT (j.args->>'i')::int, e.at FROM procrastinate_events e "
            "JOIN procrastinate_jobs j ON j.id = e.job_id "
            "WHERE e.type = 'succeeded' AND (j.args->>'i')::int >= 0"
        ).fetchall()
    lane.finishes.update({int(i): _utc(at) for i, at in rows})


# -- workers -------------------------------------------------------------------------
def _script(name: str) -> str:
    """A peer's command: next to this interpreter, else on PATH (the `bench`
    extra installed elsewhere, e.g. `pip install --target` beside a shared venv)."""
    local = BIN / name
    return str(local) if local.exists() else (shutil.which(name) or str(local))


def _arq_worker(env: dict[str, str]) -> list[str]:
    return [_script("arq"), "bench.peer_apps.arq_app.WorkerSettings"]


def _rq_worker(env: dict[str, str]) -> list[str]:
    return [_script("rq"), "worker-pool", "-n", str(CONCURRENCY), "-u", REDIS_URL, QUEUE]


def _celery_worker(env: dict[str, str]) -> list[str]:
    return [
        _script("celery"),
        "-A",
        "bench.peer_apps.celery_app",
        "worker",
        "-c",
        str(CONCURRENCY),
        "-Q",
        QUEUE,
        "--loglevel",
        "WARNING",
    ]


def _dramatiq_worker(env: dict[str, str]) -> list[str]:
    return [
        _script("dramatiq"),
        "bench.peer_apps.dramatiq_app",
        "--processes",
        "1",
        "--threads",
        str(CONCURRENCY),
        "--queues",
        QUEUE,
    ]


PROCRASTINATE_APP = "bench.peer_apps.procrastinate_app.app"


def _procrastinate_worker(env: dict[str, str]) -> list[str]:
    return [
        _script("procrastinate"),
        f"--app={PROCRASTINATE_APP}",
        "worker",
        "--concurrency",
        str(CONCURRENCY),
        f"--queues={QUEUE}",
    ]


def _flush_redis() -> None:
    from redis import Redis

    conn = Redis.from_url(REDIS_URL)
    conn.flushdb()
    conn.close()


def _stop(popen: subprocess.Popen[Any]) -> None:
    """SIGTERM to the worker's process group (pool children too), then SIGKILL."""
    if popen.poll() is not None:
        return
    os.killpg(popen.pid, signal.SIGTERM)
    try:
        popen.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(popen.pid, signal.SIGKILL)
        popen.wait()


def _start_worker(
    lane: Lane, env: dict[str, str], database: str, log_path: Path
) -> subprocess.Popen[Any]:
    """A clean broker (flushed Redis db, or a new PostgreSQL database with the
    library's schema), then the library's worker in its own process group."""
    if lane.broker == "redis":
        _flush_redis()
    else:
        import psycopg

        with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{database}"')
        subprocess.run(
            [_script("procrastinate"), f"--app={PROCRASTINATE_APP}", "schema", "--apply"],
            cwd=REPO,
            env=env,
            check=True,
            capture_output=True,
        )
    with log_path.open("w") as log:
        return subprocess.Popen(
            lane.worker(env),
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


Runner = Callable[[Lane, int, float, str, bool], Awaitable[None]]


async def run_lane(
    lane: Lane, vendor_url: str, work: Path, tasks: int, budget_s: float, batch: bool = False
) -> dict[str, Any]:
    """One system's run: a clean broker, its worker, its client submitting
    one by one (or in one batch, `batch`) and collecting, its figures."""
    database = f"bench_peers_{uuid.uuid4().hex[:8]}"
    dsn = PG_ADMIN.rsplit("/", 1)[0] + f"/{database}"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "PEER_VENDOR_URL": vendor_url,
        "PEER_VENDOR_KEY": f"peer-{lane.name}-{uuid.uuid4().hex[:6]}",
        "PEER_REDIS_URL": REDIS_URL,
        "PEER_PG_DSN": dsn,
    }
    os.environ.update({k: env[k] for k in ("PEER_VENDOR_URL", "PEER_REDIS_URL", "PEER_PG_DSN")})
    log = work / f"{lane.name}.log"
    popen = _start_worker(lane, env, database, log)
    # How fast one core is for us right now: other tenants' load changes
    # between lanes run one after the other, and this shows by how much.
    figures: dict[str, Any] = {
        "version": metadata.version(lane.package),
        "calibration_loop_wall_s": cpu_calibration()["loop_3m_wall_s"],
    }
    try:
        with PeakRss(popen.pid) as rss:
            broker = redis_server() if lane.broker == "redis" else []
            # After the warm-up job: the workers are up and connected.
            runner = RUNNERS[lane.name]
            start: dict[str, float] = {}

            def first_enqueue() -> None:
                start["worker"] = cpu_of(process_tree(popen.pid))
                start["broker"] = cpu_of(broker or pg_backends(database))

            lane.on_first_enqueue = first_enqueue
            await runner(lane, tasks, budget_s, dsn, batch)
            procs = process_tree(popen.pid)
            worker_cpu = cpu_of(procs) - start["worker"]
            broker_cpu = cpu_of(broker or pg_backends(database)) - start["broker"]
            rss.peak_mb = max(rss.peak_mb, rss.sample())
        figures.update(_figures(lane, tasks, worker_cpu, broker_cpu, rss.peak_mb))
    finally:
        _stop(popen)
        if lane.broker == "redis":
            _flush_redis()
        else:
            import psycopg

            with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
    return figures


def _figures(
    lane: Lane, tasks: int, worker_cpu: float, broker_cpu: float, rss_mb: float
) -> dict[str, Any]:
    done = len(lane.finishes)
    start = min(lane.submits, default=float("nan"))
    elapsed = max(lane.finishes.values(), default=float("nan")) - start
    latencies = [at - lane.submits[i] for i, at in lane.finishes.items()]
    return {
        "tasks": tasks,
        "succeeded": done,
        "elapsed_s": r(elapsed),
        "tasks_per_s": r(done / elapsed if elapsed > 0 else 0.0, 1),
        "enqueue_rate_per_s": r(len(lane.submits) / (lane.submits[-1] - start), 1)
        if len(lane.submits) > 1 and lane.submits[-1] > start
        else None,
        "batch_call_ms": r(lane.batch_call_s * 1000, 1) if lane.batch_call_s is not None else None,
        "submit_to_done_p50_ms": r(percentile(latencies, 50) * 1000, 1),
        "submit_to_done_p99_ms": r(percentile(latencies, 99) * 1000, 1),
        "worker_cpu_s": r(worker_cpu, 2),
        "broker_cpu_s": r(broker_cpu, 2),
        "cpu_ms_per_task": r((worker_cpu + broker_cpu) / max(1, done) * 1000, 2),
        "peak_rss_mb": r(rss_mb, 1),
        "note": lane.note,
    }


RUNNERS: dict[str, Runner] = {
    "arq": run_arq,
    "rq": run_rq,
    "celery": run_celery,
    "dramatiq": run_dramatiq,
    "procrastinate": run_procrastinate,
}

LANES = (
    Lane("arq", "arq", _arq_worker, "redis"),
    Lane("rq", "rq", _rq_worker, "redis"),
    Lane("celery", "celery", _celery_worker, "redis"),
    Lane("dramatiq", "dramatiq", _dramatiq_worker, "redis"),
    Lane("procrastinate", "procrastinate", _procrastinate_worker, "postgres"),
)


async def run(work: Path, *, tasks: int = TASKS) -> BenchResult:
    work = fresh_dir(work)
    rows: dict[str, dict[str, Any]] = {}
    notes: list[str] = []
    calibration = cpu_calibration()["loop_3m_wall_s"]
    ours = dispatch.LATEST.get(tasks) or await dispatch.run(work / "dispatcher", tasks=tasks)
    d = ours.figures
    rows["dispatcher"] = {
        "version": metadata.version("dispatcher"),
        "calibration_loop_wall_s": ours.calibration.get("before", {}).get(
            "loop_3m_wall_s", calibration
        ),
        "tasks": tasks,
        "succeeded": d["succeeded"],
        "elapsed_s": d["elapsed_s"],
        "tasks_per_s": d["tasks_per_s"],
        "enqueue_rate_per_s": d["submit_rate_per_s"],
        "submit_to_done_p50_ms": d["submit_to_terminal_minus_remote_p50_ms"],
        "submit_to_done_p99_ms": d["submit_to_terminal_minus_remote_p99_ms"],
        "worker_cpu_s": d["service_cpu_s"],
        "broker_cpu_s": 0.0,  # SQLite runs inside the service process
        "cpu_ms_per_task": d["service_cpu_ms_per_task"],
        "peak_rss_mb": d["service_rss_mb_peak"],
        "note": "POST /v1/tasks from 32 keep-alive connections; SQLite",
    }
    with Vendor(time_scale=1.0, quota=QUOTA) as vendor:
        for lane in LANES:
            print(f"   {lane.name} ...", flush=True)
            try:
                rows[lane.name] = await run_lane(lane, vendor.url, work, tasks, PEER_BUDGET_S)
            except Exception as exc:  # one peer that cannot run is a finding, not a crash
                rows[lane.name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
                notes.append(f"{lane.name} did not run: {rows[lane.name]['error']}")
        stats = vendor.stats()
    peers = {k: v for k, v in rows.items() if k != "dispatcher" and "tasks_per_s" in v}
    figures: dict[str, Any] = {
        "tasks": tasks,
        "concurrency": CONCURRENCY,
        "vendor_quota": QUOTA,
        "vendor_rate_limited": stats.get("rate_limited"),
        "vendor_max_concurrent": stats.get("max_concurrent"),
        "systems": rows,
    }
    ours_row = rows["dispatcher"]
    # A peer cut off by its budget still has a rate: tasks done / time taken.
    complete = peers
    best = max(complete, key=lambda k: complete[k]["tasks_per_s"], default=None)
    checks = []
    # Reported as it is (issue 31): each task its own request is not how
    # users submit work; the target is on the batch (benchmark 7).
    if best is None:
        checks.append(Check("peers: tasks/s vs the best peer", "reported", "no peer ran", None))
    else:
        b = complete[best]
        checks.append(
            Check(
                "peers: tasks/s vs the best peer, one by one",
                "reported (the target is on the batch, 7)",
                f"ours {ours_row['tasks_per_s']:.0f}/s p99 {ours_row['submit_to_done_p99_ms']:.0f}"
                f" ms; {best} {b['tasks_per_s']:.0f}/s p99 {b['submit_to_done_p99_ms']:.0f} ms",
                None,
            )
        )
    # The old moonshot (1,000 tasks/s one by one) stays in sight, as a
    # figure: issue 31 reports the one-by-one comparison without a target.
    checks.append(
        Check(
            "peers: one by one vs the old moonshot (1,000 tasks/s)",
            "reported (issue 31: no target one by one)",
            f"{ours_row['tasks_per_s']:.0f} tasks/s"
            + ("" if ours_row["succeeded"] == tasks else f", {ours_row['succeeded']} done"),
            None,
        )
    )
    for name, row in rows.items():
        if "error" in row:
            checks.append(Check(f"peers: {name}", "runs", row["error"][:120], False))
            continue
        checks.append(
            Check(
                f"peers: {name} {row['version']}",
                "reported",
                f"{row['tasks_per_s']:.0f}/s ({row['succeeded']} done), p50/p99 "
                f"{row['submit_to_done_p50_ms']:.0f}/{row['submit_to_done_p99_ms']:.0f} ms, "
                f"CPU {row['cpu_ms_per_task']:.2f} ms/task, RSS {row['peak_rss_mb']:.0f} MB",
                None,
            )
        )
    return BenchResult("peers", "Peers: 2,000 instant tasks, same run", figures, checks, notes)
