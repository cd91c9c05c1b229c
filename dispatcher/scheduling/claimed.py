"""What a task a lane just claimed passes before it starts.

A fallback becomes the task of the lane's model (`fallbacks.take_fallback`);
a task that asked to be canceled rather than run late is canceled when its
turn came too late for its deadline; a task whose model is no longer loaded
waits a while. The scheduler starts what comes out.
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING

from dispatcher.models import Task, TaskError
from dispatcher.pricing import is_late
from dispatcher.scheduling.fallbacks import take_fallback
from dispatcher.scheduling.lanes import LaneSpec

if TYPE_CHECKING:
    from dispatcher.scheduling.scheduler import Scheduler


async def ready_to_start(scheduler: Scheduler, task: Task, lane: LaneSpec) -> Task | None:
    """The task to start on `lane`, or None when it does not start now."""
    if task.queue not in lane.queues:
        taken = await take_fallback(scheduler, task, lane)
        if taken is None:
            return None
        task = taken
    if await _too_late(scheduler, task):
        return None
    if task.model not in scheduler.profiles:
        # A provider's lane outlived one of its models (removed by a reload):
        # the task waits a while, without holding up the rest.
        ledger = scheduler.ledger
        await ledger.hold_unloaded(task, scheduler.clock.scaled(ledger.retry_delay_s))
        return None
    return task


async def _too_late(scheduler: Scheduler, task: Task) -> bool:
    """A task asked to be canceled rather than run late, whose turn came too
    late to finish by its deadline (at its usual run time): canceled."""
    if task.deadline is None or task.deadline_action != "cancel":
        return False
    durations = await scheduler.recent_durations(task.model)
    typical_s = statistics.median(durations) if durations else 0.0
    now = scheduler.clock.now()
    if not is_late(deadline=task.deadline, now=now, expected_run_s=typical_s):
        return False
    why = f"its turn came too late to finish by its deadline (runs take ~{typical_s:.0f} s)"
    await scheduler.ledger.mark_canceled(task, error=TaskError(kind="deadline", message=why))
    return True
