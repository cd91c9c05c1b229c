"""The service as `python -m dispatcher` runs it, plus a window into its store.

`python -m bench.service_child` does what `dispatcher serve` does (settings
from the environment, the same logging, `Service.start()`, SIGTERM stops it
gracefully) and one thing more: on SIGUSR1 it writes `bench-stats.json` into
its state dir with the store's write counter (`SqliteStore.writes`, rows
written per task id) and the number of task events per task id (one on
creation and one per state transition: what the ledger announces); on
SIGUSR2 it forgets the events counted so far (a benchmark that audits cycle
by cycle keeps its own instrumentation from reading as service memory). A
subprocess keeps the service's memory and CPU its own, so the benchmarks can
measure both with psutil while still reading counters only the process has.
"""

from __future__ import annotations

import asyncio
import cProfile
import json
import os
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

from dispatcher import eventloop
from dispatcher.events import Event, TaskChanged
from dispatcher.logs import setup_logging
from dispatcher.service import Service
from dispatcher.settings import Settings

STATS_FILE = "bench-stats.json"


def _dump(service: Service, transitions: Counter[str], state_dir: Path) -> None:
    store = getattr(service, "store", None)
    writes: dict[str, int] = dict(getattr(store, "writes", {}))
    data: dict[str, Any] = {
        "pid": os.getpid(),
        "writes": writes,
        "transitions": dict(transitions),
        "events_published": service.events.published,
    }
    tmp = state_dir / (STATS_FILE + ".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, state_dir / STATS_FILE)


async def main() -> None:
    settings = Settings()
    setup_logging(settings.log_level, settings.log_format)
    service = Service(settings)
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
    loop.add_signal_handler(signal.SIGUSR2, transitions.clear)
    await service.start()
    try:
        await stop.wait()
    finally:
        await service.stop()


def run() -> None:
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
        profiler.dump_stats(profile_path)


if __name__ == "__main__":
    run()
