"""Reading tasks and jobs: ids and their prefixes, lists, summaries, queue numbers.

The ledger's read side (`Ledger` is a `TaskReads`); nothing here changes a row.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dispatcher.clock import Clock
from dispatcher.errors import AmbiguousId, NotFound
from dispatcher.models import Attempt, Job, JobSummary, State, Task
from dispatcher.store import Store
from dispatcher.tasks.waitflags import WaitFlags

MIN_ID_PREFIX = 4
MAX_CANDIDATES = 10


class TaskReads:
    store: Store
    clock: Clock
    host: str | None  # this host, whose stale tasks are its own to reclaim
    # Several hosts on one database: see `stale_running`.
    shared: bool
    flags: WaitFlags  # what a claim must look for (`waitflags`)

    async def get(self, task_id: str) -> Task:
        """A task by its id or a unique prefix of it (4+ characters), as git does."""
        task = await self.store.get_task(task_id)
        if task is None:
            task = await self.store.get_task(await self._resolve("task", task_id))
        if task is None:
            raise NotFound(f"no task {task_id!r}")
        return task

    async def get_job(self, job_id: str) -> Job:
        """A job by its id or a unique prefix of it (4+ characters)."""
        job = await self.store.get_job(job_id)
        if job is None:
            job = await self.store.get_job(await self._resolve("job", job_id))
        if job is None:
            raise NotFound(f"no job {job_id!r}")
        return job

    async def attempts(self, task: Task) -> list[Attempt]:
        return await self.store.task_attempts(task.id)

    async def list_tasks(self, **filters: Any) -> list[Task]:
        """Newest first, filtered and paged as `Store.list_tasks` documents."""
        return await self.store.list_tasks(**filters)

    async def list_jobs(self, **filters: Any) -> list[Job]:
        """Newest first, filtered and paged as `Store.list_jobs` documents."""
        return await self.store.list_jobs(**filters)

    async def job_tasks(self, job: Job) -> list[Task]:
        return await self.store.job_tasks(job.id)

    async def job_model_counts(self, job: Job) -> dict[tuple[str, State], int]:
        return await self.store.job_model_counts(job.id)

    async def job_summaries(self, jobs: Sequence[Job]) -> dict[str, JobSummary]:
        return await self.store.job_summaries([job.id for job in jobs], self.clock.now())

    async def current(self, task_id: str) -> Task | None:
        """The task as stored now (exact id), or None once it is gone."""
        return await self.store.get_task(task_id)

    async def stale_running(self, heartbeat_before: float) -> list[Task]:
        """Stale running tasks this host ran (on one host: all of them).

        Another host's task is not ours to reclaim: while that host lives it
        reclaims its own, and once it is declared dead its tasks are recovered
        by the dead-host rules, which resume a remote job instead of
        submitting it again."""
        stale = await self.store.stale_running(heartbeat_before)
        if not self.shared:
            return stale
        return [t for t in stale if t.host in (self.host, None)]

    async def queue_place(self, task: Task, *, owners: bool) -> tuple[int, int]:
        """Pending tasks of its queue ahead of this one and, with `owners`, the
        lane owners running tasks of its queue now on every host: one read."""
        return await self.store.queue_place(task.queue, task.seq, owners=owners)

    async def fallbacks_waiting(self) -> bool:
        """Whether a pending task waits with fallback queues (on any host);
        known without asking while this host is the only writer (`waitflags`)."""
        known = self.flags.fallbacks()
        if known is not None:
            return known
        found = await self.store.fallbacks_waiting()
        self.flags.answered(fallbacks=found)
        return found

    async def queued_counts(self) -> dict[str, int]:
        return await self.store.queued_counts()

    async def recent_durations(self, model: str, limit: int) -> list[float]:
        return await self.store.recent_durations(model, limit)

    async def _resolve(self, what: str, prefix: str) -> str:
        if len(prefix) < MIN_ID_PREFIX:
            raise NotFound(f"no {what} {prefix!r} (a prefix needs {MIN_ID_PREFIX}+ characters)")
        found = await self.store.ids_with_prefix(f"{what}s", prefix, limit=MAX_CANDIDATES + 1)
        if not found:
            raise NotFound(f"no {what} {prefix!r}")
        if len(found) > 1:
            raise AmbiguousId(
                what, prefix, found[:MAX_CANDIDATES], more=len(found) > MAX_CANDIDATES
            )
        return found[0]
