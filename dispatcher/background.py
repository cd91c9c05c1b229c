"""Stopping a background task: an asyncio task the service runs beside the others.

A cancel can be lost. On Python 3.11 `asyncio.wait_for` returns its inner
result, and swallows the cancel, when the inner wait completes in the same
turn of the loop as the cancel arrives (fixed in 3.12), and libraries wait
that way: psycopg_pool's wait for a free connection does. A loop that meets
such a lost cancel simply carries on, and whoever awaits it after `cancel()`
waits for ever. That is how a task once stayed `running`, its heartbeats
fresh, until the service stopped: its runner had finished, but the scheduler
waited on a heartbeat loop that had swallowed its cancel while waiting for a
PostgreSQL connection.

So a background task is cancelled again, every `RECANCEL_S`, until it has
ended. ("Job" is kept for a batch of tasks.)
"""

from __future__ import annotations

import asyncio
from typing import Any

# Short: a lost cancel is rare, and each extra round costs one timer.
RECANCEL_S = 0.05


async def stop_background(work: asyncio.Task[Any]) -> None:
    """Cancel `work` and return once it has ended, cancelling it again while it goes on.

    A background task that failed (rather than being cancelled) raises its
    exception here, as `await work` would. The caller's own cancellation is
    never swallowed.
    """
    while not work.done():
        work.cancel()
        await asyncio.wait((work,), timeout=RECANCEL_S)
    if work.cancelled():
        return
    error = work.exception()
    if error is not None:
        raise error
