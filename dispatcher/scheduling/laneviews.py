"""What the scheduler tells about lanes and tasks: a task's place and ETA (or
why it waits), and every lane's state. Reads only; the scheduler decides."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from dispatcher.accounts.health import AccountState
from dispatcher.errors import NotFound
from dispatcher.models import JSON, Kind, State, Task
from dispatcher.scheduling.decisions import ServingLane, eta_s, overdue_s, why_waiting
from dispatcher.scheduling.protocol import MemoryView

if TYPE_CHECKING:
    from dispatcher.scheduling.scheduler import Scheduler

# How long queue counts read while no task changed are answered again without
# reading (nominal seconds, scaled): a task change heard since re-reads at
# once; this bounds what a change not heard (a lost notice) can hide.
QUEUED_KEEP_S = 5.0


class QueuedCounts:
    """Pending tasks per queue for the lanes view, read again only after a
    task changed (the ledger's events: this host's writes and, on
    PostgreSQL, the other hosts' notices) or after `QUEUED_KEEP_S`: a look
    every half second at idle lanes (the dashboard, a harness) costs no
    query. A read in flight when a change is heard is not kept."""

    def __init__(self, read: Callable[[], Awaitable[dict[str, int]]]) -> None:
        self._read = read
        self._changes = 0
        self._kept: tuple[int, float, dict[str, int]] | None = None
        self.reads = 0

    def changed(self) -> None:
        self._changes += 1

    async def get(self, now: float, keep_s: float) -> dict[str, int]:
        """The counts, as of `now` (a monotonic clock) or a read since the last change."""
        kept = self._kept
        if kept is not None and kept[0] == self._changes and 0 <= now - kept[1] < keep_s:
            return dict(kept[2])
        changes = self._changes
        self.reads += 1
        counts = await self._read()
        self._kept = (changes, now, dict(counts)) if changes == self._changes else None
        return counts


async def task_progress(scheduler: Scheduler, task: Task) -> JSON:
    """`ahead`, `eta_s` and live progress for a task answer."""
    live = scheduler.running.get(task.id)
    info: JSON = {
        "ahead": 0,
        "eta_s": None,
        "overdue_s": None,
        "progress": None,
        "queue_position": None,
    }
    durations = list(await scheduler.recent_durations(task.model))
    if task.state is State.PENDING:
        ahead, others = await scheduler.ledger.queue_place(task, owners=scheduler.shared_queues)
        concurrency = sum(
            lane.concurrency
            for lane in scheduler.lanes.values()
            if task.queue in lane.queues and scheduler.accounts.is_open(lane.owner)
        )
        # A provider's quota is global (its lanes here already count it);
        # web accounts of other hosts add their own slot each.
        concurrency = max(concurrency, others)
        info["ahead"] = ahead
        info["eta_s"] = eta_s(ahead=ahead, concurrency=concurrency, recent_durations_s=durations)
        # A fallback can run on any lane of its equivalent models' queues too.
        queues = (task.queue, *task.alt_queues)
        serving = [lane for queue in queues for lane in _serving(scheduler, queue)]
        waiting = why_waiting(serving, others_serving=others)
        if waiting is None:
            waiting = _held_for_the_day(scheduler, queues)
        if waiting is not None:
            info["eta_s"] = None
            info["waiting"] = waiting
    elif task.state is State.RUNNING:
        now = scheduler.clock.now()
        elapsed = now - (task.started_at or now)
        progress = live.live.progress if live is not None else None
        since = live.live.progress_since if live is not None else None
        info["eta_s"] = eta_s(
            ahead=0,
            concurrency=1,
            recent_durations_s=durations,
            running_elapsed_s=elapsed if since is None else now - since,
            progress_pct=progress,
        )
        info["overdue_s"] = overdue_s(
            recent_durations_s=durations, running_elapsed_s=elapsed, progress_pct=progress
        )
        if live is not None:
            info["stage"] = live.live.stage.value
            info["progress"] = progress
            info["queue_position"] = live.live.queue_position
            info["stage_detail"] = live.ctx.stage_detail
            remote_eta_s = live.ctx.remote_eta_s()
            # The server's own estimate knows its queue better; once it
            # ran out (a slow run), ours stands again, overdue included.
            if remote_eta_s:
                info["eta_s"] = remote_eta_s
                info["overdue_s"] = None
    return info


def _held_for_the_day(scheduler: Scheduler, queues: tuple[str, ...]) -> str | None:
    """Why a task waits whose every lane has used its allowance or reached its
    budget for the day (or is switched off or needs attention); None while
    one lane may still take it."""
    now = scheduler.clock.now()
    reasons = []
    for lane in scheduler.lanes.values():
        if not any(queue in lane.queues for queue in queues):
            continue
        used = scheduler.allowances.said(lane.owner, now) if scheduler.allowances else None
        reached = scheduler.budgets.reached(lane.owner, now) if scheduler.budgets else None
        if used is not None:
            reasons.append(f"{lane.name}: {used.reason()}")
        elif reached is not None:
            reasons.append(reached.reason(lane.owner))
        elif (closed := _closed(scheduler, lane.owner)) is not None:
            reasons.append(f"{lane.name} {closed}")
        else:
            return None
    return "; ".join(reasons) or None


def _closed(scheduler: Scheduler, owner: str) -> str | None:
    """'is disabled' or 'needs attention': what only an operator ends."""
    try:
        state = scheduler.accounts.state(owner).state
    except NotFound:
        return "is removed"
    if state is AccountState.DISABLED:
        return "is disabled"
    return "needs attention" if state is AccountState.NEEDS_ATTENTION else None


def _serving(scheduler: Scheduler, queue: str) -> list[ServingLane]:
    serving = []
    for lane in scheduler.lanes.values():
        if queue not in lane.queues:
            continue
        try:
            account = scheduler.accounts.get(lane.owner)
        except NotFound:
            continue  # a lane on its way out while the account is removed
        view = scheduler.accounts.state(lane.owner)
        serving.append(ServingLane(lane.name, view.state, view.reason or account.reason))
    return serving


async def memory_views(scheduler: Scheduler) -> list[MemoryView]:
    """The runners' memory budgets and their use now (the web runner's browsers)."""
    views = [await runner.memory_view() for runner in scheduler.runners.values()]
    return [view for view in views if view is not None]


def _mb(value: int) -> float:
    return round(value / 1024**2, 1)


async def lanes_view(scheduler: Scheduler) -> list[JSON]:
    """Every lane: owner, models, quota, state, queue, what runs, its budget;
    a web lane also its open browser's memory and the browsers' budget."""
    queued = await scheduler.queued.get(
        scheduler.clock.monotonic(), scheduler.clock.scaled(QUEUED_KEEP_S)
    )
    memory = await memory_views(scheduler)
    browsers = {owner: size for view in memory for owner, size in view.browsers.items()}
    budget_mb = _mb(memory[0].budget_bytes) if memory else None
    view = []
    for lane in scheduler.lanes.values():
        account = scheduler.accounts.get(lane.owner)
        state = scheduler.accounts.state(lane.owner)
        now = scheduler.clock.now()
        allowance = (
            await scheduler.allowances.view(lane.owner, now) if scheduler.allowances else None
        )
        shown: dict[str, object] = {
            "state": state.state.value,
            "until": state.until,
            "reason": state.reason or account.reason,
        }
        if state.open and allowance is not None and allowance["reached"]:
            # Switched on and well, but its generations for the day are used.
            shown = {
                "state": "allowance_used",
                "until": allowance["until"],
                "reason": allowance["reason"],
            }
        view.append(
            {
                "name": lane.name,
                "kind": lane.kind.value,
                "owner": lane.owner,
                "models": list(lane.models),
                "concurrency": lane.concurrency,
                "effective_concurrency": scheduler.lane_concurrency(lane),
                "enabled": account.enabled,
                "needs_attention": account.needs_attention,
                **shown,
                "since": state.since,
                "queued": sum(queued.get(queue, 0) for queue in lane.queues),
                "running": scheduler.lane_tasks(lane.name),
                "budget": (
                    await scheduler.budgets.view(lane.owner, scheduler.clock.now())
                    if scheduler.budgets is not None
                    else None
                ),
                "allowance": allowance,
            }
        )
        if lane.kind is Kind.WEB:
            size = browsers.get(lane.owner)
            view[-1]["browser_memory_mb"] = None if size is None else _mb(size)
            view[-1]["browser_memory_budget_mb"] = budget_mb
    return view
