"""The look for stale running tasks, and what this host does about its own.

A running task whose heartbeat is older than the stale bound (90 s) has lost
its runner, a host that died or a run that hung, and is put back in line or
failed at its last attempt (`decisions.plan_reclaims`). Every host looks at
all the tasks, its own included.

This host knows more about its own runs than the store does. Suppose one of
them is alive but its beat was not written in time: the event loop was
starved of CPU or paused (a busy machine, a VM suspended, a swap storm), or
the database was slow. Reclaiming that run would stop it and run it again
from scratch. An API job would be submitted a second time and paid for
twice, because a reclaim drops the remote id and does not cancel the job at
the vendor. So a run that is alive here (`decisions.alive_here`) is left
running: the log says so (once a run) and its beat loop writes its next
beat when due (`beats.keep_beating`, which also tries again after a beat
the database refused). Other hosts cannot tell, and may reclaim it all the
same: their write wins, and this run's next write finds it withdrawn.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from dispatcher.models import Task
from dispatcher.scheduling.decisions import alive_here, plan_reclaims
from dispatcher.scheduling.protocol import Interruption
from dispatcher.scheduling.running import Running
from dispatcher.tasks.lines import lane_prefix, log_fields

if TYPE_CHECKING:
    from dispatcher.scheduling.scheduler import Scheduler

# The scheduler's logger: these lines were its own, and a log filter names it.
log = logging.getLogger("dispatcher.scheduling.scheduler")


async def reclaim_stale(scheduler: Scheduler) -> None:
    """Reclaim the running tasks whose heartbeat is stale, except the live
    runs of this host."""
    ledger, clock = scheduler.ledger, scheduler.clock
    now = clock.now()
    stale = await ledger.stale_running(now - scheduler.stale_s)
    if not stale:
        return
    plans = plan_reclaims(
        stale,
        now=now,
        stale_after_s=scheduler.stale_s,
        retry_delay_s=clock.scaled(ledger.retry_delay_s),
    )
    by_id = {t.id: t for t in stale}
    for plan in plans:
        running = scheduler.running.get(plan.task_id)
        if running is not None and running.withdrawn:
            continue
        task = by_id[plan.task_id]
        if running is not None and _same_attempt(task, running) and _alive_here(scheduler, running):
            _late_beat(scheduler, running, plan.reason)
            continue
        log.warning(
            "%s task %s attempt %d is stale: %s",
            lane_prefix(task),
            task.id,
            task.attempt,
            plan.reason,
            extra=log_fields(task, attempt=task.attempt),
        )
        await ledger.reclaim(task, plan)
        if running is not None:
            # The lane's slot stays taken until the runner has confirmed its
            # browser dead (its cleanup runs inside the cancelled coroutine).
            running.ctx.interrupt(Interruption.RECLAIMED)


def _same_attempt(task: Task, running: Running) -> bool:
    """The stale row is the attempt this host runs (not one another host took
    up since, while this host was paused)."""
    return (task.attempt, task.host) == (running.task.attempt, running.task.host)


def _alive_here(scheduler: Scheduler, running: Running) -> bool:
    runner = scheduler.runners.get(running.lane.kind)
    return alive_here(
        beats_required=runner is None or runner.beats_required,
        silent_s=scheduler.clock.monotonic() - running.ctx.last_beat_monotonic,
        stale_after_s=scheduler.stale_s,
    )


def _late_beat(scheduler: Scheduler, running: Running, reason: str) -> None:
    if running.late_beat:
        return  # said once a run: the look comes back every few seconds
    running.late_beat = True
    scheduler.late_beats += 1
    task = running.task
    log.warning(
        "%s task %s attempt %d looks stale (%s) but runs here, alive: its beat was late "
        "(this host's event loop or the database was slow); not reclaimed, its next beat "
        "is written as due",
        lane_prefix(task),
        task.id,
        task.attempt,
        reason,
        extra=log_fields(task, attempt=task.attempt),
    )
