"""A lane's claim, sent with a submit's insert (`tasks.submitclaim`).

The scheduler's side: which lane serving the new task would claim now (the
conditions of a claim carried by a run's end, `withend`, with a slot free
now, not one being given back), held under the lane's fill lock while the
insert and its claim are written, so that no round of the scheduler takes
the same slot meanwhile; then the task claimed is started as one claimed
with a run's end is (`Scheduler.start_claimed_in`: given back, pending, when
the scheduler began to stop or the lane was dropped).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from dispatcher.models import Task
from dispatcher.scheduling.lanes import LaneSpec
from dispatcher.scheduling.withend import ClaimWithEnd

if TYPE_CHECKING:
    from dispatcher.scheduling.scheduler import Scheduler


def _lane_serving(scheduler: Scheduler, task: Task) -> LaneSpec | None:
    """The first lane serving the task's queue that would claim now."""
    for lane in scheduler.lanes.values():
        if task.queue in lane.queues and scheduler.carried_claim(lane, freeing=False):
            return lane
    return None


@asynccontextmanager
async def claim_with_insert(scheduler: Scheduler, task: Task) -> AsyncIterator[ClaimWithEnd | None]:
    """The claim to send with `task`'s insert (None: the insert alone); on
    leaving, the task it claimed (`claimed`) is started in the lane."""
    lane = _lane_serving(scheduler, task)
    if lane is None:
        yield None
        return
    async with scheduler.fill_lock(lane.name):
        # Looked at again under the lock: a round may have filled the slot.
        claim = scheduler.carried_claim(lane, freeing=False)
        try:
            yield claim
        finally:
            # Also when the submit failed after the claim was written (its
            # announce, say): a task claimed is started or given back.
            if claim is not None and claim.claimed is not None:
                await scheduler.start_claimed_in(lane.name, claim.claimed)
