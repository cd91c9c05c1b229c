"""Fallback tasks (issue 30): which lane a task naming equivalent models
prefers, and why the models before the one that ran it were passed over.

A task with `models = [a, b, c]` waits in the queues of all three and runs
on whichever lane frees first. When several lanes that could take it are
free in one scheduling round, the order given wins: a lane that would take
it as a later model leaves it to a free lane of an earlier one (the claim's
`prefer`: the queues of the lanes still to fill in this round). A lane that
left something to others gets a second turn at the end of the round, so a
preferred lane that could not take it after all (its quota, its lease) does
not hold it up.

Pure decisions; the scheduler gathers the lanes' states and carries them out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dispatcher.accounts.health import AccountState, StateView
from dispatcher.accounts.switches import utc_time
from dispatcher.errors import NotFound
from dispatcher.models import Skipped, Task
from dispatcher.scheduling.decisions import free_slots
from dispatcher.scheduling.lanes import LaneSpec
from dispatcher.tasks.fingerprint import fingerprint

if TYPE_CHECKING:
    from dispatcher.scheduling.scheduler import Scheduler


def preferred_queues(
    lane: LaneSpec, later: Sequence[LaneSpec], is_free: Callable[[LaneSpec], bool]
) -> tuple[str, ...]:
    """The queues `lane`'s claim defers to: those of the lanes still to fill
    in this round that are free to take a task (its own queues aside)."""
    own = set(lane.queues)
    found: dict[str, None] = {}
    for other in later:
        if other.name != lane.name and is_free(other):
            found.update((queue, None) for queue in other.queues if queue not in own)
    return tuple(found)


def queue_model(queue: str) -> str:
    """The model a queue ("web:<model>", "api-model:<model>") belongs to."""
    return queue.split(":", 1)[1]


def passed_over(task: Task, taken_in: str) -> list[str]:
    """The queues the task listed before `taken_in` (its first choice first)."""
    order = [task.queue, *task.alt_queues]
    return order[: order.index(taken_in)] if taken_in in order else [task.queue]


@dataclass(frozen=True)
class LaneWhy:
    """A lane of a passed-over model, and why it did not take the task
    (None: it was free, it simply did not claim it first)."""

    name: str
    why: str | None


def lane_why(
    lane: LaneSpec,
    view: StateView,
    *,
    allowance: str | None,
    budget: str | None,
    running: int,
    concurrency: int,
) -> LaneWhy:
    """How one lane stood when a later choice's lane took the task."""
    name = lane.name
    if view.state is AccountState.DISABLED:
        why = f"{name} is disabled"
    elif view.state is AccountState.NEEDS_ATTENTION:
        why = f"{name} needs attention"
    elif view.state is AccountState.COOLDOWN and view.until is not None:
        why = f"{name} is cooling down until {utc_time(view.until)}"
    elif view.state is AccountState.UNREACHABLE:
        why = f"{name} is unreachable"
    elif allowance is not None:
        return LaneWhy(name, f"{name}: {allowance}")
    elif budget is not None:
        return LaneWhy(name, budget)
    elif running >= concurrency:
        return LaneWhy(name, f"{name} was busy")
    else:
        return LaneWhy(name, None)
    return LaneWhy(name, f"{why} ({view.reason})" if view.reason else why)


def skip_reason(lanes: Sequence[LaneWhy]) -> str:
    """Why a model's lanes passed the task over, lane by lane."""
    if not lanes:
        return "no lane on this host serves it"
    said = [lane.why or f"{lane.name} did not take it first" for lane in lanes]
    return "; ".join(dict.fromkeys(said))


def skipped(task: Task, taken_in: str, why: Callable[[str], list[LaneWhy]]) -> tuple[Skipped, ...]:
    """The models passed over before the one whose queue `taken_in` took the
    task; `why(queue)` says how each lane serving a queue stood."""
    queues = passed_over(task, taken_in)
    return tuple(Skipped(queue_model(queue), skip_reason(why(queue))) for queue in queues)


# -- carried out by the scheduler ---------------------------------------------------


def _lanes_why(scheduler: Scheduler, queue: str) -> list[LaneWhy]:
    now = scheduler.clock.now()
    found = []
    for lane in scheduler.lanes.values():
        if queue not in lane.queues:
            continue
        try:
            view = scheduler.accounts.state(lane.owner)
        except NotFound:
            continue  # a lane on its way out with its account
        used = scheduler.allowances.said(lane.owner, now) if scheduler.allowances else None
        reached = scheduler.budgets.reached(lane.owner, now) if scheduler.budgets else None
        found.append(
            lane_why(
                lane,
                view,
                allowance=used.reason() if used is not None else None,
                budget=reached.reason(lane.owner) if reached is not None else None,
                running=len(scheduler.lane_tasks(lane.name)),
                concurrency=scheduler.lane_concurrency(lane),
            )
        )
    return found


async def fill_preferring(scheduler: Scheduler, lanes: Sequence[LaneSpec]) -> None:
    """A round while fallbacks wait: each lane leaves them to the free lanes of
    their earlier choices still to fill, then has a second turn at the end."""
    second = []

    def free(other: LaneSpec) -> bool:
        return _may_take(scheduler, other)

    for index, lane in enumerate(lanes):
        prefer = preferred_queues(lane, lanes[index + 1 :], free)
        await scheduler.fill(lane, prefer)
        if prefer:
            second.append(lane)
    for lane in second:
        await scheduler.fill(lane)


def _may_take(scheduler: Scheduler, lane: LaneSpec) -> bool:
    """Free to take a task now, as far as this host knows without asking the store."""
    now = scheduler.clock.now()
    if not free_slots(scheduler.snapshot(lane)):
        return False  # closed (switched off, capped, unreachable) or full
    if scheduler.allowances is not None and scheduler.allowances.said(lane.owner, now):
        return False
    return not (scheduler.budgets is not None and scheduler.budgets.reached(lane.owner, now))


async def take_fallback(scheduler: Scheduler, task: Task, lane: LaneSpec) -> Task | None:
    """A task `lane` took from its fallback queues: now the task of the lane's
    model it named (fingerprint recomputed for that model), with the models
    it listed first and why they were passed over."""
    queue = next(q for q in task.alt_queues if q in lane.queues)
    profile = scheduler.profiles.get(queue_model(queue))
    ledger = scheduler.ledger
    if profile is None:
        await ledger.hold_unloaded(task, scheduler.clock.scaled(ledger.retry_delay_s))
        return None
    passed = skipped(task, queue, lambda earlier: _lanes_why(scheduler, earlier))
    print_of_model = fingerprint(profile.name, task.params, profile.fingerprint_fields)
    return await ledger.take_as(task, profile, print_of_model, passed)
