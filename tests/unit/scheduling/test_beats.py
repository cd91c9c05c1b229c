"""A host's heartbeats on one grid, the ones due together written together
(`scheduling.beats`): the grid as a pure function, the batch over a
recording writer, then the scheduler's beats over a real SQLite store."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dispatcher.errors import StoreError
from dispatcher.models import Stage, State, Task
from dispatcher.scheduling.beats import Beat, HeartbeatBatch, next_beat_in_s
from tests.support.tasks import api_task
from tests.unit.test_scheduler import _world


def _task(task_id: str) -> Task:
    return api_task(task_id, state=State.RUNNING)


@given(
    now_s=st.floats(min_value=0, max_value=1e7, allow_nan=False),
    period_s=st.floats(min_value=0.01, max_value=60),
)
def test_the_next_beat_is_on_the_grid_half_a_period_to_one_and_a_half_away(
    now_s: float, period_s: float
) -> None:
    wait_s = next_beat_in_s(now_s, period_s)
    assert period_s / 2 - 1e-6 <= wait_s <= 1.5 * period_s + 1e-6
    # Two tasks of the host, woken anywhere in the same period, aim at the same moment.
    other_s = now_s + (wait_s - period_s / 2) * 0.5 if wait_s > period_s / 2 else now_s
    assert next_beat_in_s(other_s, period_s) + other_s == pytest.approx(
        wait_s + now_s, rel=1e-9, abs=1e-6
    )


class Recorder:
    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.called = asyncio.Event()
        self.release = asyncio.Event()
        self.release.set()
        self.fail: Exception | None = None

    async def write(self, beats: Sequence[Beat]) -> list[Task | None]:
        self.calls.append([task.id for task, _ in beats])
        self.called.set()
        await self.release.wait()
        if self.fail is not None:
            raise self.fail
        return [None if task.id.startswith("lost") else task for task, _ in beats]


async def test_beats_due_in_one_turn_are_one_write_answered_each_its_own() -> None:
    recorder = Recorder()
    batch = HeartbeatBatch(recorder.write)
    tasks = [_task("a"), _task("lost-b"), _task("c")]

    answers = await asyncio.gather(*(batch.beat(t, Stage.GENERATING) for t in tasks))

    assert recorder.calls == [["a", "lost-b", "c"]]
    assert answers == [tasks[0], None, tasks[2]]


async def test_beats_arriving_during_a_write_go_together_in_the_next() -> None:
    recorder = Recorder()
    recorder.release.clear()
    batch = HeartbeatBatch(recorder.write)
    first = asyncio.create_task(batch.beat(_task("a"), None))
    await recorder.called.wait()
    later = [asyncio.create_task(batch.beat(_task(name), None)) for name in ("b", "c")]
    await asyncio.sleep(0)
    recorder.release.set()

    assert await first == _task("a")
    assert [await t for t in later] == [_task("b"), _task("c")]
    assert recorder.calls == [["a"], ["b", "c"]]
    assert batch.writes == 2


async def test_a_failed_write_fails_each_beat_and_the_next_beats_write_again() -> None:
    recorder = Recorder()
    recorder.fail = RuntimeError("database gone")
    batch = HeartbeatBatch(recorder.write)

    results = await asyncio.gather(
        batch.beat(_task("a"), None), batch.beat(_task("b"), None), return_exceptions=True
    )
    assert [str(r) for r in results] == ["database gone", "database gone"]

    recorder.fail = None
    assert (await batch.beat(_task("c"), None)).id == "c"  # type: ignore[union-attr]


async def test_a_beat_canceled_while_written_leaves_the_others_their_answers() -> None:
    recorder = Recorder()
    recorder.release.clear()
    batch = HeartbeatBatch(recorder.write)
    gone = asyncio.create_task(batch.beat(_task("gone"), None))
    kept = asyncio.create_task(batch.beat(_task("kept"), None))
    await recorder.called.wait()
    gone.cancel()
    recorder.release.set()

    assert (await kept).id == "kept"  # type: ignore[union-attr]
    assert gone.cancelled()
    await batch.aclose()


async def test_a_write_out_at_shutdown_is_stopped_and_its_beats_canceled() -> None:
    recorder = Recorder()
    recorder.release.clear()  # the database hangs
    batch = HeartbeatBatch(recorder.write)
    beat = asyncio.create_task(batch.beat(_task("a"), None))
    await recorder.called.wait()

    await asyncio.wait_for(batch.aclose(), timeout=5)

    with pytest.raises(asyncio.CancelledError):
        await beat


async def test_the_running_tasks_of_a_host_beat_in_one_write_each_period(tmp_path: Path) -> None:
    # A beat every 15 s x 0.004 = 60 ms; a task in each of the two lanes.
    async with _world(tmp_path, time_scale=0.004) as world:
        ids = [(await world.submit(model, f"long {model}")).id for model in ("m-a", "m-b")]
        await world.scheduler.round()
        assert sorted(world.scheduler.running) == sorted(ids)
        claimed_at = world.scheduler.clock.now()
        # The fake clock moves only when told: each beat then writes the new time.
        world.scheduler.clock.advance(100.0)  # type: ignore[attr-defined]

        await asyncio.sleep(world.scheduler.heartbeat_s * 8)

        for task_id in ids:
            assert (await world.ledger.get(task_id)).heartbeat_at == claimed_at + 100.0
        # Two tasks, about eight periods: the beats of a period go in one
        # write (each task's first may land on its own), not one per task.
        assert 3 <= world.scheduler.beats.writes <= 10
        for model in ("m-a", "m-b"):
            world.runner.finish(f"long {model}")


async def test_a_beat_the_database_refused_is_tried_again_and_the_outcome_still_lands(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with _world(tmp_path, time_scale=0.004) as world:
        ledger = world.ledger
        write_beats = ledger.heartbeats
        failures = 0
        beat_after_failure = asyncio.Event()

        async def flaky(beats: Sequence[Beat]) -> list[Task | None]:
            nonlocal failures
            if failures < 2:
                failures += 1
                raise StoreError("PostgreSQL is restarting")
            beat_after_failure.set()
            return await write_beats(beats)

        ledger.heartbeats = flaky  # type: ignore[method-assign]
        task = await world.submit("m-a", "beats through a hiccup")
        await world.scheduler.round()
        world.scheduler.clock.advance(100.0)  # type: ignore[attr-defined]
        await asyncio.wait_for(beat_after_failure.wait(), timeout=10)

        assert (await ledger.get(task.id)).heartbeat_at == world.scheduler.clock.now()
        assert "heartbeat not written (PostgreSQL is restarting)" in caplog.text
        world.runner.finish("beats through a hiccup")
        for _ in range(200):
            if (await ledger.get(task.id)).state is State.SUCCESS:
                break
            await asyncio.sleep(0.01)
        assert (await ledger.get(task.id)).state is State.SUCCESS
