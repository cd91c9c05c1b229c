"""The garbage collector of a serving process: what start-up built is set aside.

CPython's cyclic collector stops the event loop while it runs, and a
collection of its oldest generation walks every object that generation
holds. Once a service has started, that is mostly start-up's: the imported
modules, the web framework, Playwright's client, the profiles. Hundreds of
thousands of objects that live as long as the process, walked again by each
oldest-generation collection: 15-60 ms of a stopped loop, seen as a lane's
freed slot refilled that much late in the mixed batch (BENCHMARKS.md, 1).

`settle_after_start` collects once and then freezes what is left
(`gc.freeze`): the collector skips those objects from then on, so a
collection walks only what the service built since. Reference counting
still frees a frozen object when its last reference goes; only a cycle
among start-up's objects that became garbage later would stay (a one-off,
bounded by start-up's size).

It is for a process that serves until it stops (`serve`, `demo-run`), never
for `Service.start` itself: a test process starts many services, and
freezing there would keep every earlier test's cycles.
"""

from __future__ import annotations

import gc
import logging
import time

log = logging.getLogger("dispatcher.service")


def settle_after_start() -> int:
    """Collect, then freeze what survived; the number of objects frozen in all."""
    started = time.perf_counter()
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    log.debug(
        "garbage collector: %d objects from start-up set aside (%.0f ms)",
        frozen,
        (time.perf_counter() - started) * 1000,
    )
    return frozen
