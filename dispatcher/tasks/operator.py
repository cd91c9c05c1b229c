"""What an operator asks of tasks: cancel and retry, one task or a whole job.

The ledger's operator side (`Ledger` is an `OperatorActions`): each change is
written through the ledger's one guarded write (`Ledger._write`).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from dispatcher.errors import StateConflict
from dispatcher.events import EventBus, TaskChanged
from dispatcher.models import State, Task
from dispatcher.tasks import states
from dispatcher.tasks.reads import TaskReads

# A job-wide cancel or retry gives the event loop a turn after this many tasks.
JOB_WRITES_PER_TURN = 20
# A task moves at most pending -> running -> ended while a cancel is written.
CANCEL_TRIES = 3


class OperatorActions(TaskReads):
    events: EventBus
    retries: int

    async def _write(
        self,
        task: Task,
        new_state: State,
        changes: Mapping[str, Any],
        *,
        why: str = "",
        unless_cancel_requested: bool = False,
        fenced: bool = True,
    ) -> Task | None:
        raise NotImplementedError  # the ledger's guarded write

    async def request_cancel(self, task_id: str) -> Task:
        """Pending tasks cancel at once; running ones are flagged for their runner."""
        return await self._cancel(await self.get(task_id))

    async def _cancel(self, task: Task) -> Task:
        """Cancel `task` as last read. Moved meanwhile (a pending one claimed:
        a job-wide cancel gives the scheduler turns), it is asked again as it
        is now; one that ended meanwhile is reported as it is."""
        for _ in range(CANCEL_TRIES):
            states.check_cancel(task.state)
            if task.state is State.PENDING:
                updated = await self._write(
                    task,
                    State.CANCELED,
                    {"finished_at": self.clock.now(), "cancel_requested": True},
                )
            else:
                # An operator's request, from any host: not a write of the run.
                updated = await self._write(
                    task, State.RUNNING, {"cancel_requested": True}, fenced=False
                )
                if updated is not None:
                    self.events.publish(TaskChanged(updated))
            if updated is not None:
                return updated
            task = await self.get(task.id)
            if task.cancel_requested or task.state not in (State.PENDING, State.RUNNING):
                break
        return task

    async def retry(self, task_id: str) -> Task:
        task = await self.get(task_id)
        states.check_retry(task.state)
        plan = states.manual_retry(attempt=task.attempt, max_attempts=task.max_attempts)
        updated = await self._write(
            task,
            State.PENDING,
            {
                "attempt": plan.attempt,
                "max_attempts": plan.max_attempts,
                "not_before": 0.0,
                "stage": None,
                "remote_id": None,
                "heartbeat_at": None,
                "finished_at": None,
                "cancel_requested": False,
                "owner": None,
            },
            why="retry requested",
        )
        if updated is None:
            raise StateConflict(f"task {task_id} changed while retrying; try again")
        self.retries += 1
        return updated

    async def cancel_job(self, job_id: str) -> list[Task]:
        job = await self.get_job(job_id)
        tasks = await self.store.job_tasks(job.id)
        live = [t for t in tasks if t.state in (State.PENDING, State.RUNNING)]
        return await _giving_turns([t for t in live if not t.cancel_requested], self._cancel)

    async def retry_job(self, job_id: str) -> list[Task]:
        """Retry a job's failed tasks; a job with none is refused, as a task
        that did not fail is (a silent no-op read as "retried")."""
        job = await self.get_job(job_id)
        tasks = await self.store.job_tasks(job.id)
        failed = [task for task in tasks if task.state is State.FAILED]
        if not failed:
            counts = Counter(task.state.value for task in tasks)
            held = ", ".join(f"{n} {state}" for state, n in sorted(counts.items())) or "no tasks"
            raise StateConflict(
                f"job {job.id} has no failed task to retry ({held}); only failed tasks are retried"
            )
        return await _giving_turns(failed, lambda task: self.retry(task.id))


async def _giving_turns(
    tasks: Sequence[Task], act: Callable[[Task], Awaitable[Task]]
) -> list[Task]:
    """`act` on each task, giving the event loop a turn every few: SQLite
    writes run on the loop's thread, and a 10,000-task job done in one go held
    the loop for seconds (the HTTP API unanswered, running attempts' heartbeats
    late enough to go stale)."""
    done = []
    for n, task in enumerate(tasks, 1):
        done.append(await act(task))
        if n % JOB_WRITES_PER_TURN == 0:
            await asyncio.sleep(0)
    return done
