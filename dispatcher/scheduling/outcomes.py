"""How a run ended, and how that end is written.

`run_outcome` runs a task's runner and names how it ended: its result, an
operator's cancel, an error (a full disk said as such, a crashed runner a
transient error), or None when we interrupted it ourselves (a reclaim, a
shutdown: a shutdown leaves a resumable API job running for recovery and
puts anything else back in line).

`record_outcome` writes that end, with the lane's next claim when one rides
along (`withend`). When the write fails it still ends the attempt, without
the outcome: a task left running would go stale and be run again from
scratch.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from dispatcher.errors import RunError, TaskCanceled, TransientError
from dispatcher.models import Kind, State, Task
from dispatcher.scheduling.protocol import Interruption, Runner, RunResult
from dispatcher.scheduling.running import (
    Canceled,
    Outcome,
    Running,
    disk_full_error,
    unrecorded,
)
from dispatcher.scheduling.runtimes import polls
from dispatcher.scheduling.withend import ClaimWithEnd
from dispatcher.tasks.lines import lane_prefix, log_fields

if TYPE_CHECKING:
    from dispatcher.scheduling.scheduler import Scheduler

# The scheduler's logger: these lines were its own, and a log filter names it.
log = logging.getLogger("dispatcher.scheduling.scheduler")


async def run_outcome(scheduler: Scheduler, running: Running, runner: Runner) -> Outcome | None:
    """How the run ended; None when we interrupted it (reclaim or shutdown)."""
    try:
        result = await runner.run(running.task, running.ctx)
    except asyncio.CancelledError:
        await _after_interrupt(scheduler, running)
        # Swallow: the interrupt was ours (reclaim or shutdown), not the loop's.
        return None
    except TaskCanceled:
        return Canceled()
    except RunError as exc:
        return disk_full_error(exc, running.ctx.result_dir) or exc
    except Exception as exc:
        full = disk_full_error(exc, running.ctx.result_dir)
        if full is not None:
            running.ctx.log.error("%s", full)
            return full
        running.ctx.log.exception("%s runner crashed", running.lane.name)
        return TransientError(f"runner crashed: {exc!r}", kind="internal")
    return result


async def _after_interrupt(scheduler: Scheduler, running: Running) -> None:
    if running.ctx.interruption is not Interruption.SHUTDOWN:
        return
    ledger = scheduler.ledger
    task = await ledger.current(running.task.id)
    if task is None or task.state is not State.RUNNING:
        return
    if task.kind is Kind.API and task.remote_id:
        # The remote job keeps going; the next start resumes polling it.
        log.info(
            "%s task %s left running for recovery (remote %s)",
            lane_prefix(task),
            task.id,
            task.remote_id,
            extra=log_fields(task, attempt=task.attempt),
        )
        return
    await ledger.requeue(task, "service shut down before it finished")


async def record_outcome(
    scheduler: Scheduler,
    running: Running,
    outcome: Outcome,
    with_end: ClaimWithEnd | None = None,
) -> Task | None:
    """Write the outcome, or else end the attempt without it (`running.unrecorded`).
    `with_end`: the lane's next claim, sent with the outcome's write.
    The task as written when it succeeded, else None."""
    ledger = scheduler.ledger
    try:
        return await _write(scheduler, running, outcome, with_end)
    except Exception as exc:
        running.ctx.log.exception("recording how the attempt ended failed")
        try:
            if isinstance(outcome, Canceled):
                await ledger.mark_canceled(running.task)
            else:
                await ledger.fail(
                    running.task,
                    unrecorded(outcome, exc, resumable=running.resumable),
                    keep_remote_id=running.resumable and isinstance(outcome, RunResult),
                )
        except Exception:
            running.ctx.log.exception("ending the attempt failed too; the stale bound will")
        return None


async def _write(
    scheduler: Scheduler, running: Running, outcome: Outcome, with_end: ClaimWithEnd | None
) -> Task | None:
    task = running.task
    clock, ledger = scheduler.clock, scheduler.ledger
    durations = running.live.closed_durations(clock.now())
    match outcome:
        case RunResult():
            scheduler.health.succeeded(running.lane.owner)
            if polls(running.ctx.profile) and task.started_at:
                # Before the write: a job of the same shape claimed while it
                # is awaited polls by this run already. The vendor ran it
                # this long, written or not.
                scheduler.run_history.record(
                    task.model,
                    task.params,
                    (clock.now() - task.started_at) / clock.time_scale,
                )
            done = await ledger.succeed(task, outcome.to_json(), durations, with_end=with_end)
            if done is None or done.state is not State.SUCCESS:
                return None
            if done.started_at:
                run_s = (done.finished_at or clock.now()) - done.started_at
                (await scheduler.recent_durations(done.model)).appendleft(run_s)
            return done
        case Canceled():
            await ledger.mark_canceled(task, durations, with_end=with_end)
        case RunError():
            await _failed(scheduler, running, outcome, durations)
    return None


async def _failed(
    scheduler: Scheduler, running: Running, error: RunError, durations: dict[str, float]
) -> None:
    if await scheduler.health.hold(running, error, durations):
        return
    if error.kind == "stalled":
        scheduler.stalled_reclaims += 1
    ended = await scheduler.ledger.fail(running.task, error, durations)
    if ended is not None and ended.state is State.CANCELED:
        return  # a cancel was asked for while it ran: that outcome wins
    if running.lane.kind is Kind.WEB:
        # Only web accounts: a provider's bad spell (5xx, timeouts)
        # passes by itself, and retries already space out its tasks.
        await scheduler.health.count_failure(running.lane.owner, error)
