"""The service as `python -m dispatcher` runs it, plus a window into its store.

`python -m bench.service_child` does what `dispatcher serve` does (settings
from the environment, the same logging, `Service.start()`, SIGTERM stops it
gracefully) and one thing more: on SIGUSR1 it writes `bench-stats.json` into
its state dir with the store's write counter (`SqliteStore.writes`, rows
written per task id) and the number of task events per task id (one on
creation and one per state transition: what the ledger announces); on
SIGUSR2 it forgets the events counted so far (a benchmark that audits cycle
by cycle keeps its own instrumentation from reading as service memory),
runs a full garbage collection and writes `bench-forgot`. With
`BENCH_MEMDIAG` set the SIGUSR1 dump also holds allocator figures and live
objects by type, and `BENCH_TRACEMALLOC=<frames>` keeps a tracemalloc
snapshot per dump (`bench.memdiag` reads both). A
subprocess keeps the service's memory and CPU its own, so the benchmarks can
measure both with psutil while still reading counters only the process has.
"""

from __future__ import annotations

import asyncio
import contextlib
import cProfile
import ctypes
import gc
import json
import os
import signal
import sys
import time
import tracemalloc
from collections import Counter
from collections.abc import Sized
from pathlib import Path
from typing import Any

from demo.bootstrap import Demo
from dispatcher.events import Event, TaskChanged
from dispatcher.logs import setup_logging
from dispatcher.service import eventloop
from dispatcher.service.collector import settle_after_start
from dispatcher.service.core import Service
from dispatcher.settings import Settings

STATS_FILE = "bench-stats.json"
FORGOT_FILE = "bench-forgot"


def _dump(service: Service, transitions: Counter[str], state_dir: Path) -> None:
    store = getattr(service, "store", None)
    writes: dict[str, int] = dict(getattr(store, "writes", {}))
    data: dict[str, Any] = {
        "pid": os.getpid(),
        "writes": writes,
        "transitions": dict(transitions),
        "events_published": service.events.published,
    }
    trips = getattr(store, "round_trips", None)
    if trips is not None:
        data["round_trips"] = trips.as_dict()
    if os.environ.get("BENCH_MEMDIAG"):
        data["memdiag"] = _memdiag(state_dir)
    tmp = state_dir / (STATS_FILE + ".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, state_dir / STATS_FILE)


def _forget(transitions: Counter[str], state_dir: Path) -> None:
    """Drop the event counts, collect the garbage, say so (`FORGOT_FILE`).

    The full collection is for the memory benchmark's reading after a
    drain: garbage in reference cycles waits for the collector's oldest
    generation, which runs only once the objects that survived into it have
    grown by a quarter, so RSS read at an arbitrary moment carries up to a
    couple of MB of garbage or not, at random (seen: 92.2 MB before, 90.5
    after). Garbage cannot leak; what is reachable stays.
    """
    transitions.clear()
    gc.collect()
    (state_dir / FORGOT_FILE).write_text(str(os.getpid()))


def _memdiag(state_dir: Path) -> dict[str, Any]:
    """Live objects by type after a full collection, and (with tracemalloc on)
    a snapshot on disk: `bench.memdiag` diffs them between drains."""
    gc.collect()
    # The allocators first: the scans below allocate a few MB of their own.
    blocks = sys.getallocatedblocks()
    allocators = _allocators(state_dir)
    objects = gc.get_objects()
    by_type = Counter(type(o).__qualname__ for o in objects)
    # Dicts of plain keys and values, strings and bytes are not tracked by the
    # collector: find the large ones among what the tracked objects hold.
    seen = {id(o): o for o in objects}
    for referent in gc.get_referents(*objects):
        if id(referent) not in seen and sys.getsizeof(referent) > 64 * 1024:
            seen[id(referent)] = referent
    biggest = sorted(seen.values(), key=sys.getsizeof, reverse=True)[:8]
    out: dict[str, Any] = {
        "objects_by_type": dict(by_type.most_common(400)),
        # Blocks Python holds (objects alive) against what the allocators keep
        # from the OS: growth in the latter alone is fragmentation, not a leak.
        "allocated_blocks": blocks,
        "biggest": [_describe(o) for o in biggest],
        **allocators,
    }
    if tracemalloc.is_tracing():
        seq = len(list(state_dir.glob("snap-*.tmsnap")))
        path = state_dir / f"snap-{seq}.tmsnap"
        tracemalloc.take_snapshot().dump(str(path))
        out["snapshot"] = str(path)
        out["traced_mb"] = tracemalloc.get_traced_memory()[0] / 1024**2
    return out


async def main() -> None:
    settings = Settings()
    setup_logging(settings.log_level, settings.log_format)
    service = Service(settings, demo=Demo() if settings.demo else None)
    transitions: Counter[str] = Counter()

    def on_event(event: Event) -> None:
        if isinstance(event, TaskChanged):
            transitions[event.task.id] += 1

    service.events.listen(on_event)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, lambda: _dump(service, transitions, settings.state_dir))
    loop.add_signal_handler(signal.SIGUSR2, lambda: _forget(transitions, settings.state_dir))
    await service.start()
    settle_after_start()  # as `serve` does
    try:
        await stop.wait()
    finally:
        await service.stop()


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
            "fsmblks", "uordblks", "fordblks", "keepcost",
        )
    ]  # fmt: skip


def _describe(obj: object) -> str:
    """A large container, and who holds it (to name a structure that grows)."""
    holders = [
        type(h).__qualname__ + (f" {sorted(h)[:3]!r}"[:160] if isinstance(h, dict) else "")
        for h in gc.get_referrers(obj)
        if h is not obj and type(h).__name__ not in ("list", "cell")
    ][:3]
    sample = repr(next(iter(obj), None))[:60] if isinstance(obj, (dict, set, list)) else ""
    size = len(obj) if isinstance(obj, Sized) else -1
    kib = sys.getsizeof(obj) / 1024
    return f"{type(obj).__qualname__} {kib:.0f} KiB len {size} {sample} held by {holders}"


def _rss_by_mapping() -> dict[str, float]:
    """Resident MB by kind of mapping (/proc/self/smaps): which memory RSS holds."""
    kinds: Counter[str] = Counter()
    kind = "?"
    with contextlib.suppress(OSError), open("/proc/self/smaps") as smaps:
        for line in smaps:
            fields = line.split()
            if "-" in fields[0] and not fields[0].endswith(":"):
                start, end = (int(x, 16) for x in fields[0].split("-"))
                size_kb = (end - start) // 1024
                name = fields[5] if len(fields) > 5 else ""
                if name.startswith("["):
                    kind = name
                elif name:
                    kind = "file:" + Path(name).name if "dispatcher" in name else "file"
                elif size_kb == 1024:
                    kind = "anon 1 MiB (pymalloc arena)"
                elif size_kb >= 60 * 1024:
                    kind = "anon >= 60 MiB (glibc thread arena)"
                elif size_kb in (8192, 8196):
                    kind = "anon 8 MiB (thread stack)"
                else:
                    kind = "anon other"
            elif fields[0] == "Rss:":
                kinds[kind] += int(fields[1])
    return {k: round(v / 1024, 2) for k, v in sorted(kinds.items())}


def _allocators(state_dir: Path) -> dict[str, Any]:
    """glibc's heap (in use, free inside it, mmapped) and pymalloc's arenas."""
    out: dict[str, Any] = {}
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
        info = libc.mallinfo2()
        out["glibc_mb"] = {
            "heap": info.arena / 1024**2,
            "in_use": info.uordblks / 1024**2,
            "free_in_heap": info.fordblks / 1024**2,
            "mmapped": info.hblkhd / 1024**2,
        }
    out["rss_mb_by_mapping"] = _rss_by_mapping()
    with contextlib.suppress(OSError, AttributeError):
        sqlite = ctypes.CDLL("libsqlite3.so.0")
        sqlite.sqlite3_memory_used.restype = ctypes.c_int64
        out["sqlite_mb"] = sqlite.sqlite3_memory_used() / 1024**2
    # _debugmallocstats writes to the C stderr: catch it in a file for a moment.
    path = state_dir / "mallocstats.txt"
    saved = os.dup(2)
    try:
        with path.open("w") as handle:
            os.dup2(handle.fileno(), 2)
            sys._debugmallocstats()
    finally:
        os.dup2(saved, 2)
        os.close(saved)
    for line in path.read_text().splitlines():
        for key in ("# arenas allocated current", "# bytes in allocated blocks", "Total"):
            if line.startswith(key):
                out["pymalloc " + key.strip("# ")] = int(line.split("=")[-1].replace(",", ""))
    return out


def run() -> None:
    frames = int(os.environ.get("BENCH_TRACEMALLOC", "0"))
    if frames:
        tracemalloc.start(frames)
    profile_path = os.environ.get("BENCH_PROFILE")
    if not profile_path:
        eventloop.run(main(), Settings().event_loop)
        return
    profiler = cProfile.Profile(time.process_time)
    profiler.enable()
    try:
        eventloop.run(main(), Settings().event_loop)
    finally:
        profiler.disable()
        profiler.dump_stats(profile_path.replace("{pid}", str(os.getpid())))


if __name__ == "__main__":
    run()
