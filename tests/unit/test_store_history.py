"""The store's history side: refs, attempt rows, id prefixes, newest-first pages."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from dispatcher.errors import StoreError
from dispatcher.models import Attempt, Job, JobState, Kind, State, Task, TaskError
from dispatcher.store.sqlite import SqliteStore
from dispatcher.tasks.states import job_state


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    opened = SqliteStore(tmp_path / "d.db")
    await opened.migrate()
    yield opened
    await opened.close()


def _task(task_id: str, **changes: object) -> Task:
    return Task(
        id=task_id,
        model="m",
        kind=Kind.API,
        queue="api:p",
        params={"prompt": f"prompt of {task_id}"},
        fingerprint="fp-" + task_id,
        created_at=1.0,
    ).replace(**changes)


async def test_a_ref_is_unique_within_its_job_only(store: SqliteStore) -> None:
    await store.insert_tasks([_task("a", job_id="j1", ref="shot-1")], Job("j1", "one", 1.0))
    await store.insert_tasks([_task("b", job_id="j2", ref="shot-1")], Job("j2", "two", 2.0))
    await store.insert_tasks([_task("c"), _task("d")])  # no ref: never a clash
    assert (await store.get_task("b")).ref == "shot-1"  # type: ignore[union-attr]
    with pytest.raises(StoreError):
        await store.insert_tasks([_task("e", job_id="j1", ref="shot-1")])


async def test_an_attempt_row_is_written_only_with_the_transition_that_ends_it(
    store: SqliteStore,
) -> None:
    await store.insert_tasks([_task("a", state=State.RUNNING, owner="p", started_at=5.0)])
    ended = Attempt(
        task_id="a",
        attempt=1,
        queue="api:p",
        owner="p",
        outcome=State.PENDING,
        started_at=5.0,
        ended_at=9.0,
        error=TaskError("timeout", "no answer in 30 s"),
        stage_durations={"generating": 4.0},
    )
    changes = {"state": State.PENDING, "attempt": 2}
    assert await store.update_task("a", expect_state=State.RUNNING, changes=changes, ended=ended)
    # A late writer loses the CAS, and its attempt row is not written either.
    late = await store.update_task(
        "a", expect_state=State.RUNNING, changes={"state": State.FAILED}, ended=ended
    )
    assert late is None
    (row,) = await store.task_attempts("a")
    assert row == ended
    assert row.to_json()["error"] == {"kind": "timeout", "message": "no answer in 30 s"}


async def test_ids_resolve_from_prefixes(store: SqliteStore) -> None:
    await store.insert_tasks([_task("abcd1111"), _task("abcd2222"), _task("abce3333")])
    assert await store.ids_with_prefix("tasks", "abcd") == ["abcd1111", "abcd2222"]
    assert await store.ids_with_prefix("tasks", "abce") == ["abce3333"]
    assert await store.ids_with_prefix("tasks", "abcd2", limit=1) == ["abcd2222"]
    assert await store.ids_with_prefix("jobs", "abcd") == []
    with pytest.raises(ValueError):
        await store.ids_with_prefix("accounts", "x")


async def test_tasks_page_newest_first_with_filters(store: SqliteStore) -> None:
    await store.insert_tasks(
        [_task(f"t{i}", job_id="j", ref=f"r{i}") for i in range(5)], Job("j", "five", 1.0)
    )
    await store.insert_tasks([_task("single", model="other", params={"prompt": "café au lait"})])
    first = await store.list_tasks(limit=3)
    assert [t.id for t in first] == ["single", "t4", "t3"]
    rest = await store.list_tasks(limit=3, before_seq=first[-1].seq)
    assert [t.id for t in rest] == ["t2", "t1", "t0"]
    assert [t.id for t in await store.list_tasks(job_id="j", limit=2)] == ["t4", "t3"]
    assert [t.id for t in await store.list_tasks(model="other")] == ["single"]
    # Text is found in the prompt (non-ASCII too, though params are stored escaped)
    # and in the ref; LIKE's wildcards in the text are plain characters.
    assert [t.id for t in await store.list_tasks(text="café")] == ["single"]
    assert [t.id for t in await store.list_tasks(text="r3")] == ["t3"]
    assert await store.list_tasks(text="%") == []
    await store.update_task("t1", expect_state=State.PENDING, changes={"state": State.CANCELED})
    assert [t.id for t in await store.list_tasks(states=[State.CANCELED])] == ["t1"]


async def test_jobs_filter_by_state_as_the_state_rule_decides(store: SqliteStore) -> None:
    # Every mix of two task states, one job each; the SQL filter must agree
    # with states.job_state for every one of them.
    mixes = list(itertools.combinations_with_replacement(list(State), 2))
    for n, mix in enumerate(mixes):
        job = Job(f"job{n:02d}", f"mix {n}", float(n))
        await store.insert_tasks(
            [_task(f"j{n}t{i}", job_id=job.id, state=state) for i, state in enumerate(mix)], job
        )
    await store.insert_tasks([], Job("empty", "no tasks yet", 99.0))
    expected: dict[str, JobState] = {}
    for n, mix in enumerate(mixes):
        counts: dict[State, int] = {}
        for state in mix:
            counts[state] = counts.get(state, 0) + 1
        expected[f"job{n:02d}"] = job_state(counts)
    expected["empty"] = JobState.RUNNING
    for wanted in JobState:
        listed = {job.id for job in await store.list_jobs(states=[wanted], limit=100)}
        assert listed == {j for j, s in expected.items() if s is wanted}, wanted
    newest = await store.list_jobs(limit=2)
    assert [j.id for j in newest] == ["empty", f"job{len(mixes) - 1:02d}"]
    assert [j.id for j in await store.list_jobs(text="mix 1", limit=100)][-1] == "job01"


async def test_job_summaries_count_cache_answers_and_the_last_finish(store: SqliteStore) -> None:
    await store.insert_tasks(
        [
            _task("a", job_id="j", state=State.SUCCESS, from_cache=True, finished_at=3.0),
            _task("b", job_id="j", state=State.FAILED, finished_at=7.0),
            _task("c", job_id="j"),
        ],
        Job("j", "three", 1.0),
    )
    summary = (await store.job_summaries(["j"]))["j"]
    assert summary.counts == {State.SUCCESS: 1, State.FAILED: 1, State.PENDING: 1}
    assert (summary.from_cache, summary.last_finished_at) == (1, 7.0)
