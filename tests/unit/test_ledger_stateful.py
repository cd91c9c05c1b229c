"""Random operation sequences against the real ledger and a real SQLite file."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from dispatcher.clock import FakeClock
from dispatcher.errors import PermanentError, StateConflict, TransientError
from dispatcher.events import EventBus
from dispatcher.ledger import Ledger
from dispatcher.models import State, Task
from dispatcher.store.sqlite import SqliteStore
from dispatcher.taskspec import TaskSpec
from tests.helpers import api_profile


class LedgerMachine(RuleBasedStateMachine):
    @initialize()
    def setup(self) -> None:
        self.tmp = tempfile.TemporaryDirectory()
        self.store = SqliteStore(Path(self.tmp.name) / "d.db")
        asyncio.run(self.store.migrate())
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

    def teardown(self) -> None:
        asyncio.run(self.store.close())
        self.tmp.cleanup()

    def _prompt(self) -> str:
        self.counter += 1
        return f"prompt {self.counter}"

    @rule()
    def submit(self) -> None:
        task = asyncio.run(self.ledger.submit(TaskSpec("m-api", {"prompt": self._prompt()}))).task
        self.ids.append(task.id)

    @rule(n=st.integers(min_value=1, max_value=4))
    def create_job(self, n: int) -> None:
        job, tasks = asyncio.run(
            self.ledger.create_job(
                "j", [TaskSpec("m-api", {"prompt": self._prompt()}) for _ in range(n)]
            )
        )
        self.job_ids.append(job.id)
        self.ids.extend(t.id for t in tasks)

    @rule()
    def claim(self) -> None:
        self.clock.advance(1000.0)  # any retry delay has passed
        task = asyncio.run(self.ledger.claim(["api-model:m-api"], "prov"))
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
            asyncio.run(self.ledger.heartbeat(snap, None))

    @rule(index=st.integers(min_value=0, max_value=50))
    def finish(self, index: int) -> None:
        snap = self._running_snapshot(index)
        if snap is not None:  # may be late: the store's CAS must drop it
            asyncio.run(self.ledger.succeed(snap, {"text": "ok"}, {}))

    @rule(index=st.integers(min_value=0, max_value=50), retryable=st.booleans())
    def fail(self, index: int, retryable: bool) -> None:
        snap = self._running_snapshot(index)
        if snap is not None:
            error = TransientError("boom") if retryable else PermanentError("no")
            asyncio.run(self.ledger.fail(snap, error))

    @precondition(lambda self: bool(self.ids))
    @rule(index=st.integers(min_value=0, max_value=200))
    def cancel(self, index: int) -> None:
        task_id = self.ids[index % len(self.ids)]
        try:
            task = asyncio.run(self.ledger.request_cancel(task_id))
        except StateConflict:
            return
        if task.state is State.RUNNING:
            asyncio.run(self.ledger.mark_canceled(task))

    @precondition(lambda self: bool(self.ids))
    @rule(index=st.integers(min_value=0, max_value=200))
    def retry(self, index: int) -> None:
        with contextlib.suppress(StateConflict):
            asyncio.run(self.ledger.retry(self.ids[index % len(self.ids)]))

    @precondition(lambda self: bool(self.job_ids))
    @rule(index=st.integers(min_value=0, max_value=20))
    def retry_job(self, index: int) -> None:
        asyncio.run(self.ledger.retry_job(self.job_ids[index % len(self.job_ids)]))

    @invariant()
    def success_and_canceled_are_never_overwritten(self) -> None:
        if not hasattr(self, "store"):
            return
        for task_id in self.ids:
            task = asyncio.run(self.store.get_task(task_id))
            assert task is not None
            if task_id in self.terminal:
                assert task.state is self.terminal[task_id], (task_id, task.state)
            elif task.state in (State.SUCCESS, State.CANCELED):
                self.terminal[task_id] = task.state

    @invariant()
    def attempt_never_decreases_nor_exceeds_max(self) -> None:
        if not hasattr(self, "store"):
            return
        for task_id in self.ids:
            task = asyncio.run(self.store.get_task(task_id))
            assert task is not None
            assert 1 <= task.attempt <= task.max_attempts
            assert task.attempt >= self.attempts.get(task_id, 1)
            self.attempts[task_id] = task.attempt

    @invariant()
    def queue_positions_match_the_rows(self) -> None:
        if not hasattr(self, "store"):
            return
        rows = self.store._query(
            "SELECT lane_group, COUNT(*) FROM tasks WHERE state = 'pending' GROUP BY lane_group"
        )
        assert asyncio.run(self.store.queued_counts()) == {r[0]: r[1] for r in rows}
        for task_id in self.ids:
            task = asyncio.run(self.store.get_task(task_id))
            assert task is not None
            (expected,) = self.store._query(
                "SELECT COUNT(*) FROM tasks WHERE state = 'pending' AND lane_group = ? AND seq < ?",
                (task.lane_group, task.seq),
            )[0]
            assert asyncio.run(self.store.count_ahead(task.lane_group, task.seq)) == expected

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
        for job_id in self.job_ids:
            tasks = asyncio.run(self.store.job_tasks(job_id))
            counts = asyncio.run(self.store.job_counts(job_id))
            for state in State:
                assert counts.get(state, 0) == sum(1 for t in tasks if t.state is state)


LedgerMachine.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestLedgerStateful = LedgerMachine.TestCase
