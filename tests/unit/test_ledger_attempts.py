"""Every way a running attempt ends leaves one history row, written with the transition."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from dispatcher.clock import FakeClock
from dispatcher.errors import AmbiguousId, NotFound, PermanentError, TransientError
from dispatcher.events import EventBus
from dispatcher.models import Stage, State, Task
from dispatcher.scheduling.decisions import Reclaim
from dispatcher.store.sqlite import SqliteStore
from dispatcher.tasks.ledger import Ledger
from dispatcher.tasks.spec import TaskSpec
from tests.support.helpers import api_profile


@pytest.fixture
async def ledger(tmp_path: Path) -> AsyncIterator[Ledger]:
    store = SqliteStore(tmp_path / "d.db")
    await store.migrate()
    profile = api_profile()
    yield Ledger(store, FakeClock(), {profile.name: profile}, EventBus(), retry_delay_s=0.0)
    await store.close()


async def _claimed(ledger: Ledger, clock_s: float = 5.0) -> Task:
    assert isinstance(ledger.clock, FakeClock)
    ledger.clock.advance(clock_s)
    task = await ledger.claim(["api-model:m-api"], "prov")
    assert task is not None
    ledger.clock.advance(2.0)
    return task


async def test_each_end_of_an_attempt_is_one_row(ledger: Ledger) -> None:
    first = (await ledger.submit(TaskSpec("m-api", {"prompt": "p"}, ref="r-1"))).task
    assert first.ref == "r-1"
    running = await _claimed(ledger)
    await ledger.requeue(running, "recovered at start-up: never reached the provider")
    running = await _claimed(ledger)
    await ledger.fail(running, TransientError("timed out", kind="timeout"), {"generating": 1.5})
    running = await _claimed(ledger)
    plan = Reclaim(
        task_id=running.id,
        attempt=running.attempt,
        next_state=State.PENDING,
        next_attempt=3,
        not_before=0.0,
        reason="no heartbeat for 90 s",
    )
    await ledger.reclaim(running, plan)
    running = await _claimed(ledger)
    await ledger.heartbeat(running, None)  # not an end: no row
    await ledger.succeed(running, {"text": "done"}, {"generating": 2.0})

    rows = await ledger.attempts(await ledger.get(first.id))
    assert [(r.attempt, r.outcome) for r in rows] == [
        (1, State.PENDING),
        (1, State.PENDING),
        (2, State.PENDING),
        (3, State.SUCCESS),
    ]
    assert [r.error.kind if r.error else None for r in rows] == [
        "requeued",
        "timeout",
        "stale",
        None,
    ]
    assert rows[1].stage_durations == {"generating": 1.5}
    assert all(r.owner == "prov" and r.ended_at - r.started_at == 2.0 for r in rows)  # type: ignore[operator]


async def test_a_canceled_pending_task_never_ran_and_has_no_row(ledger: Ledger) -> None:
    task = (await ledger.submit(TaskSpec("m-api", {"prompt": "p"}))).task
    assert (await ledger.request_cancel(task.id[:6])).state is State.CANCELED
    assert await ledger.attempts(task) == []


async def test_prefixes_resolve_once_unique(ledger: Ledger) -> None:
    task = (await ledger.submit(TaskSpec("m-api", {"prompt": "p"}))).task
    assert (await ledger.get(task.id[:4])).id == task.id
    with pytest.raises(NotFound, match="4\\+ characters"):
        await ledger.get(task.id[:3])
    with pytest.raises(NotFound):
        await ledger.get_job(task.id[:8])  # a task's id is no job's
    twins = [task.replace(id="beef" + str(n) * 28, fingerprint=f"f{n}") for n in (1, 2)]
    await ledger.store.insert_tasks(twins)
    with pytest.raises(AmbiguousId) as caught:
        await ledger.get("beef")
    assert caught.value.candidates == [t.id for t in twins]


async def test_a_finished_task_shows_no_stage(ledger: Ledger) -> None:
    """A stage says where a running task is; a finished one is nowhere
    (it used to stay at `persisting` after success, `generating` after failure)."""
    done = (await ledger.submit(TaskSpec("m-api", {"prompt": "a"}))).task
    running = await _claimed(ledger)
    running = await ledger.heartbeat(running, Stage.GENERATING) or running
    await ledger.succeed(running, {"text": "done"}, {"generating": 1.0})
    succeeded = await ledger.get(done.id)
    assert (succeeded.state, succeeded.stage) == (State.SUCCESS, None)

    failed = (await ledger.submit(TaskSpec("m-api", {"prompt": "b"}))).task
    running = await _claimed(ledger)
    running = await ledger.heartbeat(running, Stage.GENERATING) or running
    await ledger.fail(running, PermanentError("refused", kind="http_400"), {"generating": 1.0})
    ended = await ledger.get(failed.id)
    assert (ended.state, ended.stage) == (State.FAILED, None)
    assert ended.to_json()["stage"] is None
