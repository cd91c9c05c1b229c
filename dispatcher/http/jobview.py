"""A job's light view: counts per model and aggregate progress, never every task.

A 10,000-task job answered with each task is megabytes, and building it
holds the event loop for seconds; watchers poll this instead and page the
tasks through /v1/jobs/{id}/tasks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dispatcher.models import JSON, Job, State

if TYPE_CHECKING:
    from dispatcher.service.core import Service

ENDED = (State.SUCCESS, State.FAILED, State.CANCELED)
# The running tasks whose estimates make the job's: more run at once only
# with that many lanes, and each estimate is a read.
MAX_RUNNING_READ = 50


async def job_progress(service: Service, job: Job) -> JSON:
    """`by_model`, `done`, `eta_s` and `waiting` of the job, from a grouped count
    and a few tasks."""
    by_model: dict[str, dict[str, int]] = {}
    for (model, state), count in (await service.ledger.job_model_counts(job)).items():
        row = by_model.setdefault(model, {s.value: 0 for s in State})
        row[state.value] += count
    done = sum(row[s.value] for row in by_model.values() for s in ENDED)
    eta, waiting = await _eta_s(service, job)
    return {"by_model": by_model, "done": done, "eta_s": eta, "waiting": waiting}


async def _eta_s(service: Service, job: Job) -> tuple[float | None, str | None]:
    """The latest estimate among the job's newest waiting task (the last of its
    queue to start) and its running ones, None when one of them has none; and
    why that waiting task cannot run, if it cannot."""
    ledger = service.ledger
    last_pending = await ledger.list_tasks(job_id=job.id, states=[State.PENDING], limit=1)
    running = await ledger.list_tasks(job_id=job.id, states=[State.RUNNING], limit=MAX_RUNNING_READ)
    etas: list[float | None] = []
    waiting: str | None = None
    for task in [*last_pending, *running]:
        progress = await service.scheduler.progress(task)
        waiting = waiting or progress.get("waiting")
        etas.append(progress["eta_s"])
    known = [eta for eta in etas if eta is not None]
    return (max(known) if known and len(known) == len(etas) else None), waiting
