"""How long a batch takes through the lanes, as the scheduler runs it (issue 30).

A pure function of the tasks to run (in the order the queues serve them,
each with its expected run time) and the open lanes (their slots and the
queues each serves). The scheduler gives a freed slot the oldest ready
task of its lane's queues at once, and a lane never waits on another; so a
lane's slots work through their queues back to back, and the batch ends
when the last slot finishes. This is list scheduling: each task, in queue
order, starts on the earliest free slot of a lane that serves its queue.

A serial web account is one slot: its tasks add up. A provider with a
quota of 3 is three slots: a long task holds one while the other two go
on (not waves that wait for their slowest). No schedule beats the lower
bound max(work / slots, the longest run); this one is within the longest
run of it (Graham's bound, property-tested).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class LaneSlots:
    """An open lane as the plan sees it: its slots (a web account 1, a
    provider its quota) and the queues it takes from."""

    name: str
    slots: int
    queues: frozenset[str]


@dataclass(frozen=True)
class PlannedRun:
    """One task to run: its queue and its expected run time (real seconds)."""

    queue: str
    run_s: float


@dataclass
class Schedule:
    makespan_s: float = 0.0
    ends_s: dict[str, float] = field(default_factory=dict)  # queue -> its last finish
    unplaced: set[str] = field(default_factory=set)  # queues no open lane serves


def simulate(runs: Sequence[PlannedRun], lanes: Sequence[LaneSlots]) -> Schedule:
    """When each queue's last task finishes if `runs` start, in order, on the
    earliest free slot of a lane serving their queue (from time 0)."""
    # One heap of slot free times per lane; a task picks the lane whose
    # earliest slot frees first. Ties go to the lane serving fewer queues:
    # of two lanes freeing together, the one that can take only this queue
    # takes it, and the other is left for what only it can serve (left to
    # chance, either may; the estimate takes the schedule that keeps both busy).
    free: list[list[float]] = [[0.0] * max(0, lane.slots) for lane in lanes]
    serving: dict[str, list[int]] = {}
    schedule = Schedule()
    for run in runs:
        candidates = serving.get(run.queue)
        if candidates is None:
            candidates = [i for i, lane in enumerate(lanes) if run.queue in lane.queues and free[i]]
            serving[run.queue] = candidates
        if not candidates:
            schedule.unplaced.add(run.queue)
            continue
        best = min(candidates, key=lambda i: (free[i][0], len(lanes[i].queues), i))
        start = heapq.heappop(free[best])
        end = start + max(0.0, run.run_s)
        heapq.heappush(free[best], end)
        schedule.ends_s[run.queue] = max(schedule.ends_s.get(run.queue, 0.0), end)
        schedule.makespan_s = max(schedule.makespan_s, end)
    return schedule
