"""A service run by the process's signals: SIGTERM and SIGINT stop it, SIGHUP reloads it.

Owns the run of `serve` (`serve_forever`: start, wait for a stop signal, stop
gracefully) and the SIGHUP handler that reloads the profiles while a service
runs (`reloading_on_hangup`, also used by `demo-run`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Iterator
from typing import TYPE_CHECKING

from dispatcher.models import JSON
from dispatcher.service.collector import settle_after_start

if TYPE_CHECKING:
    from dispatcher.service.core import Service

log = logging.getLogger("dispatcher.service")


async def serve_forever(service: Service) -> None:
    """Run until SIGTERM or SIGINT, then shut down gracefully."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await service.start()
    settle_after_start()
    try:
        with reloading_on_hangup(service):
            await stop.wait()
        log.info("shutting down: running tasks stop at their checkpoints")
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        await service.stop()


@contextlib.contextmanager
def reloading_on_hangup(service: Service) -> Iterator[None]:
    """SIGHUP reloads (as `systemctl reload` sends it) while this is open;
    without a handler, a hang-up would end the process."""
    loop = asyncio.get_running_loop()
    reloads: set[asyncio.Task[JSON]] = set()

    def on_hup() -> None:
        job = asyncio.create_task(service.reload(), name="reload")
        reloads.add(job)
        job.add_done_callback(reloads.discard)
        job.add_done_callback(_log_reload_failure)

    loop.add_signal_handler(signal.SIGHUP, on_hup)
    try:
        yield
    finally:
        loop.remove_signal_handler(signal.SIGHUP)


def _log_reload_failure(job: asyncio.Task[JSON]) -> None:
    if not job.cancelled() and job.exception() is not None:
        log.error("reload on SIGHUP failed: %s", job.exception())
