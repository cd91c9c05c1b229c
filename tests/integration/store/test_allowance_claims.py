"""Issue 30 in the store, on SQLite and PostgreSQL: a web account's day of
generations is counted from its attempts (restarts and hosts see the same
count), and a claim leaves a fallback task to the free lane of an earlier
choice (`prefer`)."""

from __future__ import annotations

from typing import Any

from dispatcher.models import Attempt, Kind, State, Task, TaskError
from dispatcher.store import Store
from tests.integration.store.conftest import OpenStore

DAY = 86_400.0
NOW = 20 * DAY + 3600.0
SINCE = 20 * DAY


def _task(task_id: str, queue: str = "web:m", **fields: Any) -> Task:
    return Task(
        id=task_id,
        model=queue.split(":", 1)[1],
        kind=Kind.WEB if queue.startswith("web:") else Kind.API,
        queue=queue,
        params={"prompt": task_id},
        fingerprint=f"fp-{task_id}",
        created_at=1.0,
        **fields,
    )


async def _run(store: Store, owner: str, at: float) -> Task:
    task = await store.claim_next(["web:m"], at, {"owner": owner, "host": "h1", "started_at": at})
    assert task is not None
    return task


async def _end(store: Store, task: Task, outcome: State, error: str | None = None) -> None:
    ended = Attempt(
        task_id=task.id,
        attempt=task.attempt,
        queue=task.queue,
        outcome=outcome,
        ended_at=(task.started_at or 0.0) + 10.0,
        owner=task.owner,
        started_at=task.started_at,
        error=TaskError(error, "x") if error else None,
    )
    done = await store.update_task(
        task.id, expect_state=State.RUNNING, changes={"state": outcome}, ended=ended
    )
    assert done is not None


async def test_an_accounts_generations_are_counted_from_its_attempts_since_the_reset(
    open_stores: OpenStore,
) -> None:
    store = await open_stores("h1")
    await store.insert_tasks([_task(f"t{i}") for i in range(7)])
    yesterday = await _run(store, "acct", NOW - DAY)
    await _end(store, yesterday, State.SUCCESS)  # before the reset: yesterday's
    done = await _run(store, "acct", NOW)
    await _end(store, done, State.SUCCESS)
    retried = await _run(store, "acct", NOW + 1)
    await _end(store, retried, State.PENDING, "timeout")  # a generation that failed counts
    held = await _run(store, "acct", NOW + 2)
    await _end(store, held, State.PENDING, "requeued")  # a cap met, a login wall: uncharged
    await _run(store, "other", NOW + 3)  # another account's
    await _run(store, "acct", NOW + 4)  # running now: counted
    assert await store.generations_since("acct", SINCE) == 3
    # Another host (or this one after a restart) reads the same count.
    other_host = await open_stores("h2")
    assert await other_host.generations_since("acct", SINCE) == 3
    assert await other_host.generations_since("acct", SINCE - DAY) == 4
    assert await other_host.generations_since("nobody", SINCE) == 0


async def test_a_claim_leaves_a_fallback_to_the_free_lane_of_an_earlier_choice(
    store: Store,
) -> None:
    # Its first choice a, then b, then c.
    order = ("api-model:b", "web:c")
    await store.insert_tasks([_task("fb", "api-model:a", alt_queues=order)])
    run = {"owner": "x", "host": "h1", "started_at": NOW}

    async def claim(queues: list[str], prefer: list[str]) -> Task | None:
        return await store.claim_next(queues, NOW, run, prefer=prefer)

    # c's lane leaves it to a free lane of a (the first choice) or of b.
    assert await claim(["web:c"], ["api-model:a"]) is None
    assert await claim(["web:c"], ["api-model:b"]) is None
    assert await claim(["web:c", "web:other"], ["api-model:zz", "api-model:b"]) is None
    # b's lane does not leave it to c's, which comes after it.
    taken = await claim(["api-model:b"], ["web:c"])
    assert taken is not None and taken.id == "fb"
    # With nobody to leave it to, c's lane takes it; a deferred fallback does
    # not hold up the lane's own tasks behind it.
    await store.insert_tasks([_task("fb2", "api-model:a", alt_queues=order), _task("own", "web:c")])
    own = await claim(["web:c"], ["api-model:b"])
    assert own is not None and own.id == "own"
    later = await claim(["web:c"], [])
    assert later is not None and later.id == "fb2"
    # A lane of the first choice itself always takes it.
    await store.insert_tasks([_task("fb3", "api-model:a", alt_queues=order)])
    first = await claim(["api-model:a"], ["api-model:b", "web:c"])
    assert first is not None and first.id == "fb3"
