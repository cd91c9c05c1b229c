"""Random operation sequences against the real ledger and a real SQLite file."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from dispatcher.clock import FakeClock
from dispatcher.errors import PermanentError, StateConflict, TransientError
from dispatcher.events import EventBus
from dispatcher.models import State, Task
from dispatcher.store.sqlite import SqliteStore
from dispatcher.tasks.ledger import Ledger
from dispatcher.tasks.spec import TaskSpec
from tests.support.helpers import api_profile

T = TypeVar("T")


class LedgerMachine(RuleBasedStateMachine):
    @initialize()
    def setup(self) -> None:
        # One event loop per run, as in the service: a new loop per call
        # (`asyncio.run`) cost most of this test's time, to no purpose.
        self.runner = asyncio.Runner()
        self.tmp = tempfile.TemporaryDirectory()
        self.store = SqliteStore(Path(self.tmp.name) / "d.db")
        self.run(self.store.migrate())
        self.clock = FakeClock()
        profile = api_profile()
        self.ledger = Ledger(
            self.store, self.clock, {profile.name: profile}, EventBus(), retry_delay_s=0.0
        )
        self.ids: list[str] = []
        self.job_ids: list[str] = []
        self.terminal: dict[str, State] = {}  # success/canceled seen: must stay
        self.attempts: dict[str, int] = {}
        self.snapshots: list[Task] = []  # old views of running tasks, for late writes
        self.counter = 0

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.runner.run(coro)

    def tasks_now(self) -> list[Task]:
        """Every task as the store has it, each read with `get_task`, in one turn."""

        async def read() -> list[Task]:
            tasks = []
            for task_id in self.ids:
                task = await self.store.get_task(task_id)
                assert task is not None, task_id
                tasks.append(task)
            return tasks

        return self.run(read())

    def teardown(self) -> None:
        self.run(self.store.close())
        self.runner.close()
        self.tmp.cleanup()

    def _prompt(self) -> str:
        self.counter += 1
        return f"prompt {self.counter}"

    @rule()
    def submit(self) -> None:
        task = self.run(self.ledger.submit(TaskSpec("m-api", {"prompt": self._prompt()}))).task
        self.ids.append(task.id)

    @rule(n=st.integers(min_value=1, max_value=4))
    def create_job(self, n: int) -> None:
        job, tasks = self.run(
            self.ledger.create_job(
                "j", [TaskSpec("m-api", {"prompt": self._prompt()}) for _ in range(n)]
            )
        )
        self.job_ids.append(job.id)
        self.ids.extend(t.id for t in tasks)

    @rule()
    def claim(self) -> None:
        self.clock.advance(1000.0)  # any retry delay has passed
        task = self.run(self.ledger.claim(["api-model:m-api"], "prov"))
        if task is not None:
            self.snapshots.append(task)

    def _running_snapshot(self, index: int) -> Task | None:
        if not self.snapshots:
            return None
        return self.snapshots[index % len(self.snapshots)]

    @rule(index=st.integers(min_value=0, max_value=50))
    def heartbeat(self, index: int) -> None:
        snap = self._running_snapshot(index)
        if snap is not None:
            self.run(self.ledger.heartbeat(snap, None))

    @rule(index=st.integers(min_value=0, max_value=50))
    def finish(self, index: int) -> None:
        snap = self._running_snapshot(index)
        if snap is not None:  # may be late: the store's CAS must drop it
            self.run(self.ledger.succeed(snap, {"text": "ok"}, {}))

    @rule(index=st.integers(min_value=0, max_value=50), retryable=st.booleans())
    def fail(self, index: int, retryable: bool) -> None:
        snap = self._running_snapshot(index)
        if snap is not None:
            error = TransientError("boom") if retryable else PermanentError("no")
            self.run(self.ledger.fail(snap, error))

    @precondition(lambda self: bool(self.ids))
    @rule(index=st.integers(min_value=0, max_value=200))
    def cancel(self, index: int) -> None:
        task_id = self.ids[index % len(self.ids)]
        try:
            task = self.run(self.ledger.request_cancel(task_id))
        except StateConflict:
            return
        if task.state is State.RUNNING:
            self.run(self.ledger.mark_canceled(task))

    @precondition(lambda self: bool(self.ids))
    @rule(index=st.integers(min_value=0, max_value=200))
    def retry(self, index: int) -> None:
        with contextlib.suppress(StateConflict):
            self.run(self.ledger.retry(self.ids[index % len(self.ids)]))

    @precondition(lambda self: bool(self.job_ids))
    @rule(index=st.integers(min_value=0, max_value=20))
    def retry_job(self, index: int) -> None:
        with contextlib.suppress(StateConflict):  # a job with no failed task
            self.run(self.ledger.retry_job(self.job_ids[index % len(self.job_ids)]))

    @invariant()
    def success_and_canceled_are_never_overwritten(self) -> None:
        if not hasattr(self, "store"):
            return
        for task in self.tasks_now():
            if task.id in self.terminal:
                assert task.state is self.terminal[task.id], (task.id, task.state)
            elif task.state in (State.SUCCESS, State.CANCELED):
                self.terminal[task.id] = task.state

    @invariant()
    def attempt_never_decreases_nor_exceeds_max(self) -> None:
        if not hasattr(self, "store"):
            return
        for task in self.tasks_now():
            assert 1 <= task.attempt <= task.max_attempts
            assert task.attempt >= self.attempts.get(task.id, 1)
            self.attempts[task.id] = task.attempt

    @invariant()
    def queue_positions_match_the_rows(self) -> None:
        if not hasattr(self, "store"):
            return
        rows = self.store._query(
            "SELECT queue, COUNT(*) FROM tasks WHERE state = 'pending' GROUP BY queue"
        )
        assert self.run(self.store.queued_counts()) == {r[0]: r[1] for r in rows}
        tasks = self.tasks_now()

        async def ahead() -> list[int]:
            return [await self.store.count_ahead(t.queue, t.seq) for t in tasks]

        for task, counted in zip(tasks, self.run(ahead()), strict=True):
            (expected,) = self.store._query(
                "SELECT COUNT(*) FROM tasks WHERE state = 'pending' AND queue = ? AND seq < ?",
                (task.queue, task.seq),
            )[0]
            assert counted == expected, task.id

    @invariant()
    def exactly_one_row_per_task(self) -> None:
        if not hasattr(self, "store"):
            return
        rows = self.store._query("SELECT id, COUNT(*) FROM tasks GROUP BY id HAVING COUNT(*) > 1")
        assert rows == []
        total = self.store._query("SELECT COUNT(*) FROM tasks")[0][0]
        assert total == len(self.ids)

    @invariant()
    def job_counts_match_their_tasks(self) -> None:
        if not hasattr(self, "store"):
            return

        async def read() -> list[tuple[list[Task], dict[State, int]]]:
            return [
                (await self.store.job_tasks(job_id), await self.store.job_counts(job_id))
                for job_id in self.job_ids
            ]

        for tasks, counts in self.run(read()):
            for state in State:
                assert counts.get(state, 0) == sum(1 for t in tasks if t.state is state)


LedgerMachine.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestLedgerStateful = LedgerMachine.TestCase
