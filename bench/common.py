"""Shared plumbing for the benchmarks: processes, clients, numbers, results.

Every benchmark runs the real service: either as a subprocess
(`python -m dispatcher`, or `python -m bench.service_child` where the
benchmark needs to look inside the store) against a demo vendor in its own
subprocess, or in-process with the bundled demo backends (the mixed batch,
which needs the demo web model and a logged-in browser profile).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import platform
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import psutil

from dispatcher.cli.service_client import wait_until_serving

REPO = Path(__file__).resolve().parent.parent
RESULTS_DIR = Path(__file__).resolve().parent / "results"
PROFILES_DIR = REPO / "profiles"
# The local PostgreSQL server's admin database (trust auth, `.ci/run` starts it).
PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"

T = TypeVar("T")


# -- results -------------------------------------------------------------------
@dataclass
class Check:
    """One target of the issue and whether this run met it."""

    name: str
    target: str
    value: str
    met: bool | None  # None: not measured in this run
    note: str = ""


@dataclass
class BenchResult:
    name: str
    title: str
    figures: dict[str, Any]
    checks: list[Check]
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    calibration: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "title": self.title,
            "seconds": round(self.seconds, 1),
            "machine": machine_info(),
            "calibration": self.calibration,
            "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "figures": self.figures,
            "checks": [asdict(c) for c in self.checks],
            "notes": self.notes,
        }


def write_result(result: BenchResult) -> Path:
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{result.name}.json"
    path.write_text(json.dumps(result.to_json(), indent=2, sort_keys=False) + "\n")
    return path


def cpu_calibration() -> dict[str, float]:
    """A fixed pure-Python loop, timed: how fast one core is for us right now.

    On an idle core of a current server CPU it takes about 0.1-0.2 s; on a
    shared machine whose other tenants keep the cores busy it takes several
    times longer, and every figure measured meanwhile is inflated alike.
    """
    wall, cpu = time.perf_counter(), time.process_time()
    total = 0
    for i in range(3_000_000):
        total += i
    return {
        "loop_3m_cpu_s": round(time.process_time() - cpu, 3),
        "loop_3m_wall_s": round(time.perf_counter() - wall, 3),
    }


def disk_calibration(directory: Path, writes: int = 50) -> dict[str, float]:
    """4 KiB written and fsynced `writes` times in `directory`, each timed:
    how long a commit waits for this machine's disk right now.

    PostgreSQL's commits wait for one (`synchronous_commit`), so its rows
    follow the disk as well as the CPU: on a VM whose CPUs spent a third of
    their time in I/O wait (and a third stolen), three hosts drained at
    103-115 tasks/s against 260-290 fifty minutes before, with the CPU
    calibration alike (0.11-0.16 s).
    """
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / ".fsync-calibration"
    times_ms: list[float] = []
    block = b"\0" * 4096
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for _ in range(writes):
            began = time.perf_counter()
            os.write(fd, block)
            os.fsync(fd)
            times_ms.append((time.perf_counter() - began) * 1000)
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)
    return {
        "fsync_p50_ms": r(percentile(times_ms, 50), 3),
        "fsync_p99_ms": r(percentile(times_ms, 99), 3),
    }


def cpu_shares(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """Of the machine's CPU time between two `psutil.cpu_times()` readings
    (as dicts), the percent stolen by the hypervisor for other guests and
    the percent idle waiting for I/O: what the CPU calibration, a loop timed
    before and after, misses when it happens in between. Linux counts a
    guest's time in `user` too: not twice here."""

    def counted(times: Mapping[str, float]) -> float:
        return sum(v for k, v in times.items() if k not in ("guest", "guest_nice"))

    total = counted(after) - counted(before)
    if total <= 0:
        return {"steal_pct": 0.0, "iowait_pct": 0.0}

    def share(name: str) -> float:
        return r(100 * (after.get(name, 0.0) - before.get(name, 0.0)) / total, 1)

    return {"steal_pct": share("steal"), "iowait_pct": share("iowait")}


# Past these, a benchmark's figures are the machine's as much as ours (a
# quiet VM here: 0-2 % stolen, 0-1 % in I/O wait, fsync p50 0.1-0.4 ms).
NOISY_STEAL_PCT = 5.0
NOISY_IOWAIT_PCT = 5.0
NOISY_FSYNC_MS = 2.0


def noise(calibration: Mapping[str, Any]) -> str:
    """Why a benchmark's run was not quiet, from its `calibration` ("" if it
    was): the hypervisor took CPU time, the CPUs waited for the disk, or
    the disk's fsync was slow before or after."""
    why: list[str] = []
    if calibration.get("steal_pct", 0.0) >= NOISY_STEAL_PCT:
        why.append(f"{calibration['steal_pct']:g} % of the CPUs' time stolen by other guests")
    if calibration.get("iowait_pct", 0.0) >= NOISY_IOWAIT_PCT:
        why.append(f"{calibration['iowait_pct']:g} % in I/O wait")
    fsync_ms = max(
        calibration.get(key, {}).get("fsync_p50_ms", 0.0) for key in ("disk_before", "disk_after")
    )
    if fsync_ms >= NOISY_FSYNC_MS:
        why.append(f"an fsync took {fsync_ms:g} ms (p50)")
    return "; ".join(why)


def machine_info() -> dict[str, Any]:
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 1024**3, 1),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "load_avg_1m_at_end": round(os.getloadavg()[0], 2),
    }


# -- numbers -------------------------------------------------------------------
def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def r(value: float, digits: int = 3) -> float:
    return round(value, digits) if math.isfinite(value) else value


# -- profiles ------------------------------------------------------------------
def profiles_dir(
    target: Path, names: Iterable[str], replace: Mapping[str, Mapping[str, str]] | None = None
) -> Path:
    """A profiles dir holding copies of bundled profiles, optionally with text replaced."""
    for name in names:
        copy_profile(target, name, replace=(replace or {}).get(name, {}))
    return target


def copy_profile(
    target: Path, source: str, name: str | None = None, replace: Mapping[str, str] | None = None
) -> Path:
    """Copy bundled profile `source` into `target` (as `name`), replacing text in it."""
    target.mkdir(parents=True, exist_ok=True)
    text = (PROFILES_DIR / f"{source}.toml").read_text()
    changes = dict(replace or {})
    if name is not None and name != source:
        changes[f'name = "{source}"'] = f'name = "{name}"'
    for old, new in changes.items():
        if old not in text:
            raise RuntimeError(f"profile {source}: {old!r} not found; the profile changed")
        text = text.replace(old, new)
    path = target / f"{name or source}.toml"
    path.write_text(text)
    return path


# -- processes -----------------------------------------------------------------
def _stop(popen: subprocess.Popen[Any], timeout_s: float = 30.0) -> int | None:
    if popen.poll() is None:
        popen.send_signal(signal.SIGTERM)
        try:
            popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait()
    return popen.returncode


class DemoProc:
    """A bundled demo backend in its own process (`python -m demo api|web`)."""

    def __init__(self, kind: str, time_scale: float, quota: int = 3) -> None:
        args = [sys.executable, "-m", "demo", kind, "--time-scale", str(time_scale)]
        if kind == "api":
            args += ["--quota", str(quota)]
        self.popen = subprocess.Popen(
            args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        assert self.popen.stdout is not None
        self.url = self.popen.stdout.readline().strip()
        if not self.url.startswith("http://127.0.0.1:"):
            _stop(self.popen)
            raise RuntimeError(f"demo {kind} did not start: {self.url!r}")

    def stats(self) -> dict[str, Any]:
        return dict(httpx.get(f"{self.url}/__stats", timeout=10).json())

    def reset(self) -> None:
        httpx.post(f"{self.url}/__reset", timeout=10).raise_for_status()

    def stop(self) -> None:
        _stop(self.popen)
        if self.popen.stdout is not None:
            self.popen.stdout.close()

    def __enter__(self) -> DemoProc:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class Vendor(DemoProc):
    """The demo API provider in its own process (`python -m demo api`)."""

    def __init__(self, time_scale: float, quota: int) -> None:
        super().__init__("api", time_scale, quota)


class ServiceProc:
    """The dispatcher in its own process; answers once its port and token are written."""

    def __init__(
        self,
        state_dir: Path,
        env: Mapping[str, str],
        log_path: Path,
        module: str = "dispatcher",
        args: Sequence[str] = (),
    ) -> None:
        self.state_dir = state_dir
        self.log_path = log_path
        state_dir.mkdir(parents=True, exist_ok=True)
        for name in ("port", "token"):
            (state_dir / name).unlink(missing_ok=True)
        full_env = {**os.environ, "DISPATCHER_STATE_DIR": str(state_dir), **env}
        with log_path.open("a") as handle:
            self.popen = subprocess.Popen(
                [sys.executable, "-m", module, *args],
                cwd=REPO,
                env=full_env,
                stdout=handle,
                stderr=subprocess.STDOUT,
                text=True,
            )
        self.pid = self.popen.pid
        self._wait_ready()
        self.url = f"http://127.0.0.1:{(state_dir / 'port').read_text().strip()}"
        self.token = (state_dir / "token").read_text().strip()

    def _wait_ready(self) -> None:
        if wait_until_serving(
            self.state_dir, alive=lambda: self.popen.poll() is None, timeout_s=60
        ):
            return
        if self.popen.poll() is not None:
            raise RuntimeError(f"service exited with {self.popen.returncode}:\n{self.log()}")
        _stop(self.popen)
        raise RuntimeError(f"service did not come up:\n{self.log()}")

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def client(self, timeout_s: float = 30.0) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.headers, timeout=timeout_s)

    def async_client(self, limit: int = 32, timeout_s: float = 60.0) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=self.url,
            headers=self.headers,
            timeout=timeout_s,
            limits=httpx.Limits(max_connections=limit, max_keepalive_connections=limit),
        )

    def rss_mb(self) -> float:
        return float(psutil.Process(self.pid).memory_info().rss) / 1024**2

    def cpu_s(self) -> float:
        times = psutil.Process(self.pid).cpu_times()
        return float(times.user + times.system)

    def log(self, tail: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-tail:]
        except OSError:
            return ""

    def child_stats(self, timeout_s: float = 30.0) -> dict[str, Any]:
        """Counters from `bench.service_child` (SIGUSR1 makes it write them)."""
        path = self.state_dir / "bench-stats.json"
        path.unlink(missing_ok=True)
        os.kill(self.pid, signal.SIGUSR1)
        deadline = time.monotonic() + timeout_s
        while not path.exists():
            if time.monotonic() > deadline or self.popen.poll() is not None:
                raise RuntimeError(f"no stats from the service child:\n{self.log()}")
            time.sleep(0.02)
        return dict(json.loads(path.read_text()))

    def forget_child_stats(self, timeout_s: float = 30.0) -> None:
        """Make `bench.service_child` drop the event counts behind `child_stats`
        (SIGUSR2): kept across cycles, they would read as service memory. It
        also runs a full garbage collection; this returns once both are done."""
        path = self.state_dir / "bench-forgot"
        path.unlink(missing_ok=True)
        os.kill(self.pid, signal.SIGUSR2)
        deadline = time.monotonic() + timeout_s
        while not path.exists():
            if time.monotonic() > deadline or self.popen.poll() is not None:
                raise RuntimeError(f"the service child did not answer SIGUSR2:\n{self.log()}")
            time.sleep(0.02)

    def stop(self, timeout_s: float = 30.0) -> int | None:
        return _stop(self.popen, timeout_s)

    def __enter__(self) -> ServiceProc:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def service_env(
    profiles: Path, vendor_url: str, *, time_scale: float, concurrency: Mapping[str, int]
) -> dict[str, str]:
    return {
        "DISPATCHER_PROFILES_DIR": str(profiles),
        "DISPATCHER_TIME_SCALE": str(time_scale),
        "DISPATCHER_CONCURRENCY": json.dumps(dict(concurrency)),
        "DEMO_API_URL": vendor_url,
        "DEMO_API_KEY": "bench-" + os.urandom(6).hex(),
    }


def read_tasks(db_path: Path) -> list[dict[str, Any]]:
    """Every task row of a stopped service's SQLite database (read-only)."""
    uri = f"file:{db_path}?mode=ro"
    with sqlite3.connect(uri, uri=True) as db:
        db.row_factory = sqlite3.Row
        rows = db.execute(
            "SELECT id, model, kind, state, attempt, created_at, started_at, finished_at, "
            "params, result, stage_durations FROM tasks ORDER BY seq"
        ).fetchall()
    out = []
    for row in rows:
        item = dict(row)
        for key in ("params", "result", "stage_durations"):
            if item[key]:
                item[key] = json.loads(item[key])
        out.append(item)
    return out


async def call(
    client: httpx.AsyncClient, method: str, url: str, tries: int = 4, **kwargs: Any
) -> httpx.Response:
    """One request, sent again when the connection broke under it.

    On a loaded machine a keep-alive connection can sit idle past uvicorn's
    5 s keep-alive timeout and be closed just as the next request goes out.
    Sending a task again is safe: the same fingerprint within 30 s is
    de-duplicated onto the first one.
    """
    for attempt in range(tries):
        try:
            return await client.request(method, url, **kwargs)
        except httpx.TransportError:
            if attempt == tries - 1:
                raise
            await asyncio.sleep(0.05 * (attempt + 1))
    raise AssertionError("unreachable")


def fresh_dir(path: Path) -> Path:
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


# -- process trees -------------------------------------------------------------
def process_tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def cpu_of(procs: Iterable[psutil.Process]) -> float:
    """User + system CPU of these processes and of their children already reaped."""
    total = 0.0
    for proc in procs:
        try:
            t = proc.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


def on_cpu_s(pid: int) -> float:
    """Seconds the process's live threads have run, from the scheduler's own
    account (`schedstat`, nanoseconds); `cpu_times()` counts clock ticks
    (10 ms), too coarse for a few milliseconds of work."""
    return schedstat_s(pid)[0]


def schedstat_s(pid: int) -> tuple[float, float]:
    """`/proc/PID/task/*/schedstat` summed, in one read: seconds the
    process's live threads have run on a core, and waited for one while
    they could have run."""
    ran_ns = waited_ns = 0
    for stat in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        try:
            ran, waited = stat.read_text().split()[:2]
            ran_ns, waited_ns = ran_ns + int(ran), waited_ns + int(waited)
        except (OSError, ValueError):
            continue  # a thread that ended meanwhile
    return ran_ns / 1e9, waited_ns / 1e9


def rss_mb_of(procs: Iterable[psutil.Process]) -> float:
    total = 0
    for proc in procs:
        try:
            total += proc.memory_info().rss
        except psutil.Error:
            continue
    return total / 1024**2


class PeakRss:
    """Samples the summed RSS of a process tree from a thread (so that a
    client blocking its event loop cannot starve it); `peak_mb` at the end."""

    def __init__(self, pid: int, period_s: float = 0.1) -> None:
        self.pid = pid
        self.peak_mb = 0.0
        self._period_s = period_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="peak-rss", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak_mb = max(self.peak_mb, self.sample())
            self._stop.wait(self._period_s)

    def sample(self) -> float:
        return rss_mb_of(process_tree(self.pid))

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def round_order(names: list[str], round_: int) -> list[str]:
    """The set-ups of round `round_`, each round starting one further on: a
    machine that slows down or speeds up during the run favours none."""
    start = round_ % len(names)
    return names[start:] + names[:start]


def lower_middle(ordered: list[T]) -> T:
    """The median of sorted values, the lower middle of an even count (a
    value that was measured, not an average of two)."""
    return ordered[(len(ordered) - 1) // 2]


def median_run(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The round of median tasks/s, with every round's tasks/s beside it."""
    middle = lower_middle(sorted(rounds, key=lambda run: run["tasks_per_s"]))
    return {**middle, "tasks_per_s_rounds": [run["tasks_per_s"] for run in rounds]}
