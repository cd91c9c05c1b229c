"""Plan a batch before it runs (issue 30): tasks, cost, makespan, what stops it.

A pure decision: the caller (`http.planview`) reads what the plan needs (the
batch's tasks as intake would build them, twins and cache hits, each
model's expected run time, the open lanes, the providers' spend today) and
this module decides.

The makespan is the scheduler's own schedule, simulated (`makespan.simulate`):
the tasks already waiting, then the batch's in its order, each on the
earliest free slot of an open lane serving its queue (a web account one
slot, a provider its quota). A model's expected run time is the mean of its
recent runs on this service (a lane's time is their sum), else the
profile's `expected_run_s` scaled by the time scale, else unknown; but a
task carrying the param its profile's run time follows (`run_s_param`) is
expected to run that param times `run_s_per_unit` (a video's seconds set
its render time), each task its own time in the schedule. Models
that share a lane owner share its slots and form one group; no schedule
beats the group's lower bound max(work / slots, the longest run), which
the plan names.

Web accounts' daily allowances (`[web] daily_limit`) cap a group's capacity
per day: when every account serving a group has one and what they have left
today is less than the group's tasks, the plan says which allowance stops
the batch, about when, and until which reset the rest waits.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dispatcher.tasks.makespan import LaneSlots, PlannedRun, Schedule, simulate


@dataclass(frozen=True)
class ModelLoad:
    """One model's share of the batch, as read by the caller."""

    model: str
    tasks: int  # lines of the batch naming it
    duplicates: int = 0  # the same request twice in the batch: runs once
    twins: int = 0  # an identical task submitted recently: answered by it
    cached: int = 0  # a cached result answers it at once
    cost_usd: float | None = 0.0  # estimated, for the tasks that would run
    unpriced: int = 0  # tasks to run without a price table
    run_s: float | None = None  # expected run time, real seconds; None: unknown
    run_from: str = "history"  # "history" (its recent runs), "profile" (expected_run_s), "param"
    # Each task to run, in the batch's order: its own expected run time (real
    # seconds, from its run-time param), None where it has none (then run_s).
    task_run_s: tuple[float | None, ...] = ()
    owners: tuple[str, ...] = ()  # lane owners serving it (providers, web accounts)
    capacity: int = 0  # slots of its open lanes
    queued_ahead: int = 0  # pending tasks already in its queue
    queue: str = ""  # the queue its tasks wait in ("" : one of its own)

    @property
    def queue_name(self) -> str:
        return self.queue or f"model:{self.model}"

    @property
    def to_run(self) -> int:
        return max(0, self.tasks - self.duplicates - self.twins - self.cached)

    @property
    def fallback_run_s(self) -> float | None:
        """A task's time when it has no param of its own: run_s, else (no
        history, no expected_run_s) the mean of the param-driven times."""
        if self.run_s is not None:
            return self.run_s
        known = [t for t in self.task_run_s if t is not None]
        return sum(known) / len(known) if known else None

    def run_times_s(self) -> list[float] | None:
        """Expected run time of each task it adds to the schedule: those queued
        ahead, then the batch's to run; None when one of them is unknown."""
        fallback = self.fallback_run_s
        own = list(self.task_run_s[: self.to_run])
        own += [None] * (self.to_run - len(own))
        times = [fallback] * self.queued_ahead + [fallback if t is None else t for t in own]
        if any(t is None for t in times):
            return None
        return [t for t in times if t is not None]

    @property
    def timed_from(self) -> str:
        """Where its times come from: "param" when any task's param sets its own."""
        return "param" if any(t is not None for t in self.task_run_s) else self.run_from


def param_run_s(
    params: Mapping[str, Any], param: str | None, per_unit_s: float | None, time_scale: float
) -> float | None:
    """A task's expected run time (real seconds) from the param its profile's
    run time follows; None when the profile names none or the task lacks it."""
    if param is None or per_unit_s is None:
        return None
    value = params.get(param)
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        units = float(value)
    except ValueError:
        return None
    if not math.isfinite(units) or units < 0:
        return None
    return units * per_unit_s * time_scale


@dataclass(frozen=True)
class BudgetLeft:
    provider: str
    limit_usd: float
    spent_usd: float

    @property
    def left_usd(self) -> float:
        return max(0.0, self.limit_usd - self.spent_usd)


@dataclass(frozen=True)
class AllowanceLeft:
    """A web account's generations per day, and how many it started today."""

    account: str
    limit: int
    used: int
    until: float  # its next reset, epoch seconds
    resets_at: str  # "00:00 UTC"

    @property
    def left(self) -> int:
        return max(0, self.limit - self.used)


@dataclass
class Plan:
    models: list[dict[str, Any]] = field(default_factory=list)
    total: dict[str, Any] = field(default_factory=dict)
    stops: list[str] = field(default_factory=list)  # budgets, allowances that would stop it
    refusals: list[str] = field(default_factory=list)  # --max-cost / --deadline unmet

    def to_json(self) -> dict[str, Any]:
        return {
            "models": self.models,
            "total": self.total,
            "stops": self.stops,
            "refusals": self.refusals,
            "ok": not self.refusals,
        }


def _groups(loads: Sequence[ModelLoad]) -> list[list[ModelLoad]]:
    """Models sharing any lane owner, together (they share its slots)."""
    groups: list[tuple[set[str], list[ModelLoad]]] = []
    for load in loads:
        owners = set(load.owners) or {f"model:{load.model}"}
        joined = [g for g in groups if g[0] & owners]
        merged: tuple[set[str], list[ModelLoad]] = (owners, [load])
        for group in joined:
            merged[0].update(group[0])
            merged[1].extend(group[1])
            groups.remove(group)
        groups.append(merged)
    return [members for _, members in groups]


def _group_time(members: Sequence[ModelLoad], capacity: int, schedule: Schedule) -> dict[str, Any]:
    count = sum(m.to_run + m.queued_ahead for m in members)
    timed = [m for m in members if m.to_run + m.queued_ahead > 0]
    times = {m.model: m.run_times_s() for m in timed}
    unknown = [model for model, each in times.items() if each is None]
    if count == 0:
        return {"estimate_s": 0.0, "lower_bound_s": 0.0, "bound": "nothing to run"}
    if unknown:
        return {
            "estimate_s": None,
            "lower_bound_s": None,
            "bound": f"no run history: {', '.join(unknown)}",
        }
    if capacity <= 0 or any(m.queue_name in schedule.unplaced for m in timed):
        return {"estimate_s": None, "lower_bound_s": None, "bound": "no open lane serves it"}
    every_s = [t for each in times.values() for t in each or ()]
    work_s = sum(every_s)
    mean_s = work_s / count
    longest_s = max(every_s, default=0.0)
    estimate_s = max(schedule.ends_s.get(m.queue_name, 0.0) for m in timed)
    by_lanes = work_s / capacity
    if by_lanes >= longest_s:
        bound = f"lane capacity: {count} tasks x {mean_s:.1f} s over {capacity} slots"
    else:
        bound = f"longest single run: {longest_s:.1f} s"
    if any(m.timed_from == "param" for m in timed):
        params = sorted({m.model for m in timed if m.timed_from == "param"})
        bound += f" (each task's run time from its param: {', '.join(params)})"
    elif any(m.run_from == "profile" for m in timed):
        bound += " (from expected_run_s: no run history yet)"
    return {
        "estimate_s": round(estimate_s, 3),
        "lower_bound_s": round(max(by_lanes, longest_s), 3),
        "bound": bound,
    }


def _lanes_from(loads: Sequence[ModelLoad]) -> list[LaneSlots]:
    """Lanes as the loads describe them, when the caller gives none: each owner
    one lane with its share of the model's slots, serving the models it serves."""
    slots: dict[str, int] = {}
    queues: dict[str, set[str]] = {}
    for load in loads:
        owners = load.owners or (f"model:{load.model}",)
        for owner in owners:
            share = max(1, round(load.capacity / len(owners))) if load.capacity > 0 else 0
            slots[owner] = max(slots.get(owner, 0), share)
            queues.setdefault(owner, set()).add(load.queue_name)
    return [LaneSlots(owner, slots[owner], frozenset(queues[owner])) for owner in slots]


def _runs(loads: Sequence[ModelLoad], order: Sequence[str] | None) -> list[PlannedRun]:
    """The tasks in the order the queues serve them: those already waiting,
    then the batch's (in `order`, the models of its tasks to run, when given),
    each with its own expected run time."""
    times = {load.model: load.run_times_s() for load in loads}
    known = {load.model: load for load in loads if times[load.model] is not None}
    runs = [
        PlannedRun(load.queue_name, run_s)
        for load in known.values()
        for run_s in (times[load.model] or [])[: load.queued_ahead]
    ]
    if order is None:
        order = [load.model for load in loads for _ in range(load.to_run)]
    taken = dict.fromkeys(known, 0)
    for model in order:
        load = known.get(model)
        own = times.get(model)
        if load is None or own is None:
            continue
        index = load.queued_ahead + taken[model]
        taken[model] += 1
        # More tasks in `order` than the load counted: its fallback time.
        run_s = own[index] if index < len(own) else load.fallback_run_s
        if run_s is not None:
            runs.append(PlannedRun(load.queue_name, run_s))
    return runs


def plan_batch(
    loads: Sequence[ModelLoad],
    budgets: Mapping[str, BudgetLeft],
    *,
    now: float,
    max_cost_usd: float | None = None,
    deadline: float | None = None,
    lanes: Sequence[LaneSlots] | None = None,
    order: Sequence[str] | None = None,
    allowances: Mapping[str, AllowanceLeft] | None = None,
) -> Plan:
    """`lanes`: the open lanes (else drawn from the loads' owners and slots);
    `order`: the model of each task to run, in the batch's order (else the
    loads' order)."""
    plan = Plan()
    schedule = simulate(_runs(loads, order), _lanes_from(loads) if lanes is None else lanes)
    allowances = allowances or {}
    for load in loads:
        plan.models.append(
            {
                "model": load.model,
                "tasks": load.tasks,
                "duplicates": load.duplicates,
                "twins": load.twins,
                "cached": load.cached,
                "to_run": load.to_run,
                "queued_ahead": load.queued_ahead,
                "cost_usd": None if load.cost_usd is None else round(load.cost_usd, 6),
                "unpriced": load.unpriced,
                "run_s": None if load.fallback_run_s is None else round(load.fallback_run_s, 3),
                "run_from": load.timed_from if load.fallback_run_s is not None else None,
                "capacity": load.capacity,
                "per_day": _per_day(load, allowances),
            }
        )
    times: list[dict[str, Any]] = []
    for members in _groups(loads):
        capacity = _shared_capacity(members)
        timing = _group_time(members, capacity, schedule)
        timing["models"] = sorted(m.model for m in members)
        times.append(timing)
        ends = {m.model: schedule.ends_s.get(m.queue_name, 0.0) for m in members}
        for row in plan.models:
            if row["model"] in timing["models"]:
                row.update({k: timing[k] for k in ("estimate_s", "lower_bound_s", "bound")})
                if timing["estimate_s"] is not None:
                    # The model's own last finish within its group's schedule.
                    row["estimate_s"] = round(ends[row["model"]], 3)
    known = [t for t in times if t["estimate_s"] is not None]
    slowest = max(known, key=lambda t: t["estimate_s"], default=None)
    whole = len(known) == len(times)
    cost = sum(load.cost_usd or 0.0 for load in loads)
    plan.total = {
        "tasks": sum(load.tasks for load in loads),
        "to_run": sum(load.to_run for load in loads),
        "deduplicated": sum(load.duplicates + load.twins for load in loads),
        "cached": sum(load.cached for load in loads),
        "cost_usd": round(cost, 6),
        "unpriced": sum(load.unpriced for load in loads),
        "makespan_s": slowest["estimate_s"] if slowest and whole else None,
        "lower_bound_s": (max(t["lower_bound_s"] for t in known) if known and whole else None),
        "bound": (
            f"{', '.join(slowest['models'])}: {slowest['bound']}"
            if slowest and whole
            else _unknown(times)
        ),
    }
    spent = _budget_stops(loads, budgets, times)
    held = _allowance_stops(loads, allowances, times)
    plan.stops = spent + [stop for stop, _ in held]
    if max_cost_usd is not None and cost > max_cost_usd + 1e-9:
        plan.refusals.append(f"estimated cost ${cost:,.2f} is over --max-cost ${max_cost_usd:,.2f}")
    if deadline is not None:
        makespan = plan.total["makespan_s"]
        if makespan is None:
            plan.refusals.append(f"cannot promise the deadline: {plan.total['bound']}")
        elif now + makespan > deadline:
            plan.refusals.append(
                f"estimated makespan {makespan:,.0f} s ends {now + makespan - deadline:,.0f} s "
                "after the deadline"
            )
    plan.refusals += [f"stopped by a budget: {stop}" for stop in spent]
    if deadline is not None:
        plan.refusals += [
            f"the rest waits past the deadline: {stop}" for stop, until in held if until > deadline
        ]
    return plan


def _per_day(load: ModelLoad, allowances: Mapping[str, AllowanceLeft]) -> int | None:
    """Generations per day its accounts' allowances allow; None when one has none."""
    if not load.owners or any(owner not in allowances for owner in load.owners):
        return None
    return sum(allowances[owner].limit for owner in load.owners)


def _allowance_stops(
    loads: Sequence[ModelLoad],
    allowances: Mapping[str, AllowanceLeft],
    times: list[dict[str, Any]],
) -> list[tuple[str, float]]:
    """Which accounts' allowances run out before the batch is done, about when,
    and the reset the rest waits for (each with that reset's instant)."""
    stops = []
    for members in _groups(loads):
        owners = sorted({owner for m in members for owner in m.owners})
        if not owners or any(owner not in allowances for owner in owners):
            continue  # an account without an allowance takes the rest
        ahead = sum(m.queued_ahead for m in members)
        wanted = sum(m.to_run for m in members)
        left = sum(allowances[owner].left for owner in owners)
        if wanted == 0 or wanted + ahead <= left:
            continue
        fits = max(0, left - ahead)
        timing = next((t for t in times if members[0].model in t["models"]), None)
        when = ""
        if timing and timing["estimate_s"] and fits:
            when = f", about {timing['estimate_s'] * left / (wanted + ahead):,.0f} s in"
        first = min(owners, key=lambda owner: allowances[owner].until)
        reset = allowances[first]
        used = ", ".join(
            f"{owner} {allowances[owner].used} of {allowances[owner].limit}" for owner in owners
        )
        stops.append(
            (
                f"allowance {', '.join(sorted(m.model for m in members))}/day ({used} used): "
                f"{left} left cover{'s' if left == 1 else ''} {fits} of {wanted} tasks"
                f"{' after ' + str(ahead) + ' queued' if ahead else ''}{when}; "
                f"the rest waits until {reset.resets_at}",
                reset.until,
            )
        )
    return stops


def _unknown(times: list[dict[str, Any]]) -> str:
    """Why the makespan is unknown: the models without run history, then the rest."""
    missing = sorted(
        model
        for t in times
        if t["estimate_s"] is None and t["bound"].startswith("no run history")
        for model in t["bound"].removeprefix("no run history: ").split(", ")
    )
    other = [
        t["bound"]
        for t in times
        if t["estimate_s"] is None and not t["bound"].startswith("no run history")
    ]
    said = [f"no run history: {', '.join(missing)}"] if missing else []
    return "; ".join(said + other)


def _shared_capacity(members: Sequence[ModelLoad]) -> int:
    """Slots of the group's lanes: a lane owner serving two models counts once
    (its largest capacity share among them)."""
    if len(members) == 1:
        return members[0].capacity
    per_owner: dict[str, float] = {}
    for member in members:
        owners = member.owners or (f"model:{member.model}",)
        for owner in owners:
            share = member.capacity / len(owners)
            per_owner[owner] = max(per_owner.get(owner, 0.0), share)
    return max(1, round(sum(per_owner.values()))) if per_owner else 0


def _budget_stops(
    loads: Sequence[ModelLoad], budgets: Mapping[str, BudgetLeft], times: list[dict[str, Any]]
) -> list[str]:
    """Which provider's budget runs out before the batch is done, and when."""
    stops = []
    for provider, left in sorted(budgets.items()):
        served = [load for load in loads if provider in load.owners and load.to_run > 0]
        # A model served by several providers spreads over them by slot.
        cost = sum((load.cost_usd or 0.0) / max(1, len(load.owners)) for load in served)
        if cost <= left.left_usd + 1e-9:
            continue
        tasks = sum(load.to_run / max(1, len(load.owners)) for load in served)
        fits = _tasks_that_fit(served, left.left_usd)
        when = ""
        timing = next((t for t in times if served and served[0].model in t["models"]), None)
        if timing and timing["estimate_s"] and tasks:
            when = f", about {timing['estimate_s'] * fits / tasks:,.0f} s in"
        stops.append(
            f"budget {provider}/day: ${left.spent_usd:,.2f} of ${left.limit_usd:,.2f} spent; "
            f"${left.left_usd:,.2f} left covers about {fits} of {tasks:.0f} tasks "
            f"(${cost:,.2f} wanted){when}"
        )
    return stops


def _tasks_that_fit(served: Sequence[ModelLoad], left_usd: float) -> int:
    """How many tasks the money left pays for, cheapest model first (the claim
    takes a task that fits even when a dearer one ahead of it does not)."""
    fits = 0
    for load in sorted(served, key=lambda m: (m.cost_usd or 0.0) / max(1, m.to_run)):
        share = load.to_run / max(1, len(load.owners))
        each = (load.cost_usd or 0.0) / max(1, load.to_run)
        taken = share if each <= 0 else min(share, left_usd // each)
        fits += int(taken)
        left_usd -= taken * each
    return fits
