"""A host's heartbeats, lined up so that the ones due together are one write.

Every running task beats every `heartbeat_s` (15 s) while it shows signs of
life, so that another host (or this one after a restart) can tell a live
run from an abandoned one (stale after 90 s). Written one by one, each beat
is a statement, a round trip on PostgreSQL: twenty web accounts and a few
API lanes, on each of several hosts, beat apart all the time. Here:

- the beats keep to one grid per host (`next_beat_in_s`: the multiples of
  `heartbeat_s` on the loop's clock, at least half a period ahead, so two
  beats of a task are 7.5-22.5 s apart, well inside the 90 s stale bound);
- `HeartbeatBatch` gathers the beats that fall due in the same turn of the
  event loop and hands them to the ledger together
  (`Ledger.heartbeats`, `store.beats`: one statement on PostgreSQL).

A beat answers with the task as written: a cancel asked for on another host
shows in it (`cancel_requested`), the fallback for a lost notice.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

from dispatcher.background import stop_background
from dispatcher.errors import StoreError
from dispatcher.models import Stage, Task
from dispatcher.scheduling.protocol import Interruption, Runner
from dispatcher.scheduling.running import Running

if TYPE_CHECKING:
    from dispatcher.scheduling.scheduler import Scheduler

Beat = tuple[Task, Stage | None]
WriteBeats = Callable[[Sequence[Beat]], Awaitable[list[Task | None]]]


def next_beat_in_s(now_s: float, period_s: float) -> float:
    """Seconds from `now_s` to this host's next beat: the next multiple of
    `period_s`, or the one after when that is less than half a period away."""
    wait_s = period_s - now_s % period_s
    return wait_s + period_s if wait_s < period_s / 2 else wait_s


class HeartbeatBatch:
    """The beats due in one turn of the loop, written in one call.

    `beat` waits for its own task's answer. While a write is out, the beats
    arriving meanwhile wait for the next one: one write at a time, however
    many tasks run.
    """

    def __init__(self, write: WriteBeats) -> None:
        self._write = write
        self._due: list[tuple[Beat, asyncio.Future[Task | None]]] = []
        self._writer: asyncio.Task[None] | None = None
        self.writes = 0  # calls made, for tests and the curious

    async def beat(self, task: Task, stage: Stage | None) -> Task | None:
        """`task` as written with this beat; None when its attempt or lease moved on."""
        answer: asyncio.Future[Task | None] = asyncio.get_running_loop().create_future()
        self._due.append(((task, stage), answer))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write_due(), name="heartbeats")
        return await answer

    async def _write_due(self) -> None:
        while self._due:
            # The beats falling due at this same moment join before the write.
            await asyncio.sleep(0)
            due, self._due = self._due, []
            self.writes += 1
            try:
                written = await self._write([beat for beat, _ in due])
            except asyncio.CancelledError:
                # Stopped while writing (`aclose`): nobody waits on for ever.
                for _, answer in due:
                    answer.cancel()
                raise
            except Exception as exc:
                for _, answer in due:
                    if not answer.done():
                        answer.set_exception(exc)
                continue
            for (_, answer), task in zip(due, written, strict=True):
                if not answer.done():  # its loop may have been stopped meanwhile
                    answer.set_result(task)

    async def aclose(self) -> None:
        """Stop a write still out (the service is stopping); its beats are moot."""
        writer, self._writer = self._writer, None
        if writer is not None and not writer.done():
            with contextlib.suppress(Exception):
                await stop_background(writer)
        for _, answer in self._due:
            answer.cancel()
        self._due = []


async def keep_beating(scheduler: Scheduler, running: Running, runner: Runner) -> None:
    """A running task's heartbeats, from its first (on the host's grid) for
    as long as it runs; a cancel its beat's answer shows reaches its run."""
    loop = asyncio.get_running_loop()
    written_beat = running.started_monotonic
    while scheduler.running.get(running.task.id) is running:
        try:
            seen = None
            if not runner.beats_required or running.ctx.last_beat_monotonic > written_beat:
                # Otherwise no sign of life since the last write: let staleness speak.
                written_beat = running.ctx.last_beat_monotonic
                seen = await scheduler.beats.beat(running.task, running.live.stage)
                if seen is not None:
                    running.task = seen
            else:
                seen = await scheduler.ledger.current(running.task.id)
        except StoreError as exc:
            # A database that hiccups must not end the beating (nor, raised
            # when the run ends, its outcome's write): the next beat tries
            # again, and only a silence of the stale bound reclaims the task.
            running.ctx.log.warning("heartbeat not written (%s); the next one tries again", exc)
        if seen is not None and seen.cancel_requested:
            # The fallback for a cancel whose notice was lost (asked on
            # another host while our listener was reconnecting).
            running.ctx.interrupt(Interruption.CANCELED)
        await asyncio.sleep(next_beat_in_s(loop.time(), scheduler.heartbeat_s))


__all__ = ["Beat", "HeartbeatBatch", "keep_beating", "next_beat_in_s"]
