"""`POST /v1/plan`: what a batch would cost and take, without submitting it.

Reads what `planning.plan_batch` needs: each task built as intake would
build it (fingerprint, estimated cost), the batch's own duplicates, recent
twins and cache hits, each model's expected run time (the mean of its recent
runs here, else its profile's `expected_run_s` at the time scale; a task
with the param its profile's run time follows, its own time), the open
lanes (slots and queues), the order the batch's tasks would wait in, the
queues' pending tasks and the providers' spend today.
"""

from __future__ import annotations

import asyncio
import statistics
from collections import defaultdict
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from dispatcher import strictjson
from dispatcher.errors import InputError
from dispatcher.models import JSON, Task
from dispatcher.pricing import day_start
from dispatcher.scheduling.allowances import clock_text, last_reset, next_reset
from dispatcher.tasks.makespan import LaneSlots
from dispatcher.tasks.planning import (
    AllowanceLeft,
    BudgetLeft,
    ModelLoad,
    param_run_s,
    plan_batch,
)
from dispatcher.tasks.spec import parse_plan

if TYPE_CHECKING:
    from dispatcher.service.core import Service


async def plan_answer(service: Service, raw: object) -> JSON:
    specs, max_cost_usd, deadline = parse_plan(raw)
    intake = service.ledger.intake
    await intake.learn(specs)
    hashes = await intake.image_hashes(specs, in_job=True)
    by_model: dict[str, list[Task]] = defaultdict(list)
    batch: list[Task] = []
    for index, (spec, images) in enumerate(zip(specs, hashes, strict=True)):
        try:
            task = intake.new_task(spec, None, images)
        except InputError as exc:
            raise InputError(f"tasks[{index}]: {exc}") from exc
        by_model[spec.model].append(task)
        batch.append(task)
    queued = await service.ledger.queued_counts()
    scheduler = service.scheduler
    loads = []
    to_run: set[str] = set()  # ids of the tasks that would run
    for model, tasks in by_model.items():
        load, running = await _load(service, model, tasks, queued)
        loads.append(load)
        to_run.update(running)
    order = [task.model for task in batch if task.id in to_run]
    lanes = [
        LaneSlots(lane.name, scheduler.lane_concurrency(lane), frozenset(lane.queues))
        for lane in scheduler.lanes.values()
        if scheduler.accounts.is_open(lane.owner)
    ]
    now = service.clock.now()
    budgets = {}
    if scheduler.budgets is not None:
        for provider, limit in scheduler.budgets.limits.items():
            spent = await service.store.spent_since(provider, day_start(now))
            budgets[provider] = BudgetLeft(provider, limit, spent)
    plan = plan_batch(
        loads,
        budgets,
        now=now,
        max_cost_usd=max_cost_usd,
        deadline=deadline,
        lanes=lanes,
        order=order,
        allowances=await _allowances(service, now),
    )
    return plan.to_json()


async def _allowances(service: Service, now: float) -> dict[str, AllowanceLeft]:
    """Each web account's allowance and what it started since its last reset."""
    book = service.scheduler.allowances
    found = {}
    for account, allowance in (book.limits if book is not None else {}).items():
        since = last_reset(now, allowance.reset_minute)
        used = await service.store.generations_since(account, since)
        found[account] = AllowanceLeft(
            account,
            allowance.limit,
            used,
            next_reset(now, allowance.reset_minute),
            clock_text(allowance.reset_minute),
        )
    return found


async def _load(
    service: Service, model: str, tasks: list[Task], queued: dict[str, int]
) -> tuple[ModelLoad, list[str]]:
    """The model's share of the batch, and the ids of its tasks that would run."""
    intake = service.ledger.intake
    scheduler = service.scheduler
    seen: set[str] = set()
    duplicates = twins = cached = unpriced = 0
    cost = 0.0
    running: list[str] = []
    for task in tasks:
        if not task.force and task.fingerprint in seen:
            duplicates += 1
            continue
        seen.add(task.fingerprint)
        if not task.force and await intake.twin(task) is not None:
            twins += 1
            continue
        cache = intake.cache
        if (
            not task.force
            and cache is not None
            and await asyncio.to_thread(cache.has, task.fingerprint)
        ):
            cached += 1
            continue
        running.append(task.id)
        if task.cost_estimate is None:
            unpriced += 1
        else:
            cost += task.cost_estimate
    queue = tasks[0].queue
    lanes = [
        lane
        for lane in scheduler.lanes.values()
        if queue in lane.queues and scheduler.accounts.is_open(lane.owner)
    ]
    durations = list(await scheduler.recent_durations(model))
    run_s, run_from = _expected_run_s(service, model, durations)
    profile = service.profiles.get(model)
    by_id = {task.id: task for task in tasks}
    task_run_s = tuple(
        param_run_s(
            by_id[task_id].params,
            profile.run_s_param,
            profile.run_s_per_unit,
            service.clock.time_scale,
        )
        if profile is not None
        else None
        for task_id in running
    )
    load = ModelLoad(
        model=model,
        tasks=len(tasks),
        duplicates=duplicates,
        twins=twins,
        cached=cached,
        cost_usd=cost,
        unpriced=unpriced,
        run_s=run_s,
        run_from=run_from,
        task_run_s=task_run_s,
        owners=tuple(sorted({lane.owner for lane in lanes})),
        capacity=sum(scheduler.lane_concurrency(lane) for lane in lanes),
        queued_ahead=queued.get(queue, 0),
        queue=queue,
    )
    return load, running


def _expected_run_s(
    service: Service, model: str, durations: list[float]
) -> tuple[float | None, str]:
    """Real seconds one task of the model is expected to run: the mean of its
    recent runs (a lane's time is their sum, so the mean, not the median),
    else the profile's `expected_run_s` at the service's time scale."""
    if durations:
        return statistics.fmean(durations), "history"
    profile = service.profiles.get(model)
    if profile is not None and profile.expected_run_s is not None:
        return profile.expected_run_s * service.clock.time_scale, "profile"
    return None, "history"


def plan_routes(service: Service) -> list[Route]:
    async def plan(request: Request) -> Response:
        raw = await request.body()
        if not raw:
            raise InputError("request body is empty; send JSON")
        return JSONResponse(await plan_answer(service, strictjson.loads(raw)))

    return [Route("/v1/plan", plan, methods=["POST"])]
