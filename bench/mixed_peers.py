"""Benchmark 1 on the peers: the mixed batch on Celery and on Dramatiq.

The same 40 tasks (seed, durations, time scale) as ours, each system on its
own demo backends (`python -m demo api|web`, quota 3), its own Redis
database, and its own Chromium on the account's profile, logged in
beforehand as for ours. The jobs are written as each library's users would
(`bench/peer_apps/celery_mixed.py`, `dramatiq_mixed.py`); their workers are
started with the library's own command line, one per queue: `web` at
concurrency 1 (the account's lock), `api` at the quota (Celery) or behind
Dramatiq's `ConcurrentRateLimiter` of 3. The batch is sent once the web
worker's browser has its page up (a warm-up task), as ours is sent once the
service's browser is up; each task is published by name from this client
(Celery's `send_task`, a Dramatiq message), in the plan's order.

Per task the jobs write to Redis when the provider accepted it (API) or the
prompt was sent (web), when it finished, whether it succeeded, and its
attempts; `bench.mixed_batch.analyse` turns them into the same figures as ours.
"""

from __future__ import annotations

import asyncio
import math
import os
import subprocess
import time
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.common import REPO, Check, DemoProc, fresh_dir
from bench.mixed import login
from bench.mixed_batch import API_CONCURRENCY, Outcome, Planned, analyse
from bench.peer_apps import mixed_jobs as jobs
from bench.peers import _script, _stop

if TYPE_CHECKING:  # the bench extra's: `make unit` imports this module's checks without it
    import redis

PEERS = ("celery", "dramatiq")
REDIS_DB = {"celery": 12, "dramatiq": 13}
API_THREADS = 8  # Dramatiq's api worker: as many as the baseline pool's workers
WARM_UP_BUDGET_S = 90.0
# Each peer stops at this multiple of LB: the web lane serialised in one
# worker needs about LB plus its per-task page time.
CAP_OVER_LB = 1.4


def peers_from_env(default: Sequence[str] = PEERS) -> tuple[str, ...]:
    """`BENCH_MIXED_PEERS`: which peers run beside ours, comma-separated (empty:
    none, for A/B runs of ours alone); unset: Celery and Dramatiq."""
    raw = os.environ.get("BENCH_MIXED_PEERS")
    if raw is None:
        return tuple(default)
    names = tuple(n.strip() for n in raw.split(",") if n.strip())
    unknown = [n for n in names if n not in PEERS]
    if unknown:
        raise ValueError(f"BENCH_MIXED_PEERS: unknown {unknown}; known {list(PEERS)}")
    return names


def worker_commands(name: str) -> list[list[str]]:
    """Each peer's workers, one per queue, as its command line starts them."""
    if name == "celery":
        app = ["-A", "bench.peer_apps.celery_mixed", "worker", "--loglevel", "WARNING"]
        return [
            [_script("celery"), *app, "-Q", "web", "-c", "1", "-n", "web@%h"],
            [_script("celery"), *app, "-Q", "api", "-c", str(API_CONCURRENCY), "-n", "api@%h"],
        ]
    module = "bench.peer_apps.dramatiq_mixed"
    return [
        [_script("dramatiq"), module, "--processes", "1", "--threads", "1", "--queues", "web"],
        [
            _script("dramatiq"),
            module,
            "--processes",
            "1",
            "--threads",
            str(API_THREADS),
            "--queues",
            "api",
        ],
    ]


def _start_workers(name: str, env: dict[str, str], log: Path) -> list[subprocess.Popen[Any]]:
    """The peer's workers, each in its own process group (its pool and browser too)."""
    with log.open("w") as handle:
        return [
            subprocess.Popen(
                command,
                cwd=REPO,
                env=env,
                stdout=handle,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            for command in worker_commands(name)
        ]


class Sender:
    """Publishes the batch's tasks by name, as a client of that library."""

    def __init__(self, name: str, redis_url: str) -> None:
        self.name = name
        if name == "celery":
            from celery import Celery

            self.celery = Celery("mixed-client", broker=redis_url)
        else:
            from dramatiq.brokers.redis import RedisBroker

            self.dramatiq = RedisBroker(url=redis_url)

    def send(self, queue: str, args: list[Any]) -> None:
        if self.name == "celery":
            self.celery.send_task(f"mixed.{queue}", args=args, queue=queue)
            return
        from dramatiq import Message

        message: Message[Any] = Message(
            queue_name=queue, actor_name=queue, args=tuple(args), kwargs={}, options={}
        )
        self.dramatiq.enqueue(message)

    def close(self) -> None:
        if self.name == "celery":
            self.celery.close()
        else:
            self.dramatiq.close()


def _args(task: Planned, scale: float) -> tuple[str, list[Any]]:
    if task.kind == "web":
        return "web", [task.index, task.prompt, round(task.nominal_s * scale, 3)]
    return "api", [task.index, task.model, task.prompt, round(task.nominal_s, 3)]


def _outcomes(
    records: redis.Redis, tasks: Sequence[Planned], t0: float, sent: dict[int, float]
) -> tuple[list[Outcome], int]:
    """The tasks as the jobs recorded them; how many have finished."""
    out: list[Outcome] = []
    rows = jobs.read_all(records, [task.index for task in tasks])
    for task, row in zip(tasks, rows, strict=True):
        if not row:
            continue
        started = float(row["started"]) - t0 if "started" in row else None
        finished = float(row["finished"]) - t0 if "finished" in row else None
        out.append(
            Outcome(
                task.index,
                task.kind,
                created=sent[task.index],
                started=started,
                finished=finished,
                ok=row.get("ok") == "1",
                attempts=int(row.get("attempts", "1")),
                error=row.get("error", ""),
            )
        )
    return out, sum(1 for o in out if o.finished is not None)


async def _wait_warm(
    records: redis.Redis, popens: Sequence[subprocess.Popen[Any]], log: Path
) -> None:
    deadline = time.monotonic() + WARM_UP_BUDGET_S
    while "finished" not in jobs.read_all(records, [-1])[0]:
        if any(p.poll() is not None for p in popens):
            raise RuntimeError(f"a worker exited; see {log}")
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"the web worker's browser was not up in {WARM_UP_BUDGET_S:.0f} s"
                f" (the workers' last line: {_last_line(log)!r})"
            )
        await asyncio.sleep(0.1)


def _last_line(log: Path) -> str:
    """Why a worker was not up, as it said it (its log's last line, cut)."""
    try:
        lines = log.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return lines[-1][-200:] if lines else ""


async def run_peer(
    name: str, work: Path, tasks: Sequence[Planned], scale: float, *, cap_s: float
) -> dict[str, Any]:
    """One peer's run of the batch: its figures as `analyse` gives ours, plus its own."""
    from dispatcher.settings import find_browser

    browser = find_browser()
    if browser is None:
        raise RuntimeError("no Chromium found")
    work = fresh_dir(work)
    redis_url = f"redis://127.0.0.1:6379/{REDIS_DB[name]}"
    import redis

    records = redis.Redis.from_url(redis_url)
    records.flushdb()
    with DemoProc("api", scale, API_CONCURRENCY) as api, DemoProc("web", scale) as web:
        profile = work / "profile"
        await login(browser, profile, web.url)
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
            "MIXED_API_URL": api.url,
            "MIXED_WEB_URL": web.url,
            "MIXED_SCALE": repr(scale),
            "MIXED_PROFILE": str(profile),
            "MIXED_BROWSER": browser,
            "MIXED_REDIS_URL": redis_url,
        }
        log = work / "workers.log"
        popens: list[subprocess.Popen[Any]] = []
        sender = Sender(name, redis_url)
        try:
            popens += _start_workers(name, env, log)
            sender.send("web", [-1, "warm-up", 0.0])
            await _wait_warm(records, popens, log)
            t0 = time.time()
            sent: dict[int, float] = {}
            for task in tasks:
                sent[task.index] = time.time() - t0
                sender.send(*_args(task, scale))
            deadline = time.monotonic() + cap_s
            while True:
                outcomes, done = _outcomes(records, tasks, t0, sent)
                if done == len(tasks) or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.2)
        finally:
            sender.close()
            for popen in popens:
                _stop(popen)
            records.flushdb()
            records.close()
        web_stats = web.stats()
        api_stats = api.stats()
    return {
        **analyse(tasks, outcomes, scale, cap_s=cap_s),
        "system": name,
        "version": metadata.version(name),
        "finished_within_cap": done == len(tasks),
        "cap_s": round(cap_s, 1),
        "web_collisions": web_stats.get("collisions"),
        "web_generations": web_stats.get("generations"),
        "api_rate_limited": api_stats.get("rate_limited"),
        "workers": [" ".join([Path(c[0]).name, *c[1:]]) for c in worker_commands(name)],
    }


async def run_peers(
    names: Sequence[str], work: Path, tasks: Sequence[Planned], scale: float, lb_s: float
) -> dict[str, dict[str, Any]]:
    """Every peer at once (each on its own backends): a peer that cannot run is a finding."""

    async def one(name: str) -> dict[str, Any]:
        try:
            return await run_peer(name, work / name, tasks, scale, cap_s=CAP_OVER_LB * lb_s)
        except Exception as exc:
            return {"system": name, "error": f"{type(exc).__name__}: {exc}"[:500]}

    rows = await asyncio.gather(*(one(name) for name in names))
    return dict(zip(names, rows, strict=True))


def _makespan(row: dict[str, Any]) -> float:
    """A run that did not finish every task counts as never finishing."""
    value = row.get("makespan_s")
    return float(value) if isinstance(value, int | float) and row.get("all_succeeded") else math.inf


def _row_text(row: dict[str, Any]) -> str:
    if "error" in row:
        return f"did not run ({row['error'][:80]})"
    ratio = row.get("makespan_over_lb")
    span = f"{row['makespan_s']:.1f} s = {ratio:.3f} x LB" if ratio else f"{row['makespan_s']}"
    return (
        f"makespan {span}, API excess wait mean {row['api_excess_wait_mean_s']:.3f} s, "
        f"collisions {row.get('web_collisions')}, failed {len(row['failed'])}"
        f" + unfinished {row['unfinished']}"
    )


def peer_checks(ours: dict[str, Any], peers: dict[str, dict[str, Any]]) -> list[Check]:
    """Ours against every peer of the same run: best makespan and API excess
    wait of all, with 0 collisions (a peer that could not run leaves the
    target unmeasured, so not met); then each peer's figures, reported."""
    if not peers:
        return []
    ran = [row for row in peers.values() if "error" not in row]
    met = (
        len(ran) == len(peers)
        and bool(ours.get("all_succeeded"))
        and ours.get("web_collisions") == 0
        and all(_makespan(ours) <= _makespan(row) for row in ran)
        and all(
            ours["api_excess_wait_mean_s"] <= row["api_excess_wait_mean_s"]
            or not math.isfinite(row["api_excess_wait_mean_s"])
            for row in ran
        )
    )
    names = ", ".join(peers)
    checks = [
        Check(
            f"mixed: ours vs {names}, same batch, same run",
            "best makespan and API excess wait, 0 collisions",
            f"ours {_row_text(ours)}; "
            + "; ".join(f"{name} {_makespan_short(row)}" for name, row in peers.items()),
            met,
        )
    ]
    for name, row in peers.items():
        version = row.get("version", "")
        checks.append(Check(f"mixed: {name} {version}".strip(), "reported", _row_text(row), None))
    return checks


def _makespan_short(row: dict[str, Any]) -> str:
    if "error" in row:
        return "did not run"
    return (
        f"{row['makespan_s']} s / {row['api_excess_wait_mean_s']:.3f} s / "
        f"{row.get('web_collisions')}"
    )
