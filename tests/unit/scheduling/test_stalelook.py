"""The look for stale running tasks (`scheduling.stalelook`): a run that hung
is reclaimed; a run alive on this host whose beat was late is not (its API
job would be submitted and paid for twice)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from dispatcher.clock import FakeClock
from dispatcher.models import State
from dispatcher.scheduling.decisions import alive_here
from dispatcher.scheduling.protocol import Interruption
from dispatcher.scheduling.running import Running
from tests.unit.test_scheduler import World, _world


@given(
    silent_s=st.floats(min_value=0, max_value=1e6, allow_nan=False),
    stale_after_s=st.floats(min_value=0.01, max_value=1e4),
)
def test_a_run_is_alive_here_when_it_needs_no_beats_or_beat_within_the_bound(
    silent_s: float, stale_after_s: float
) -> None:
    assert alive_here(beats_required=False, silent_s=silent_s, stale_after_s=stale_after_s)
    assert alive_here(beats_required=True, silent_s=silent_s, stale_after_s=stale_after_s) == (
        silent_s <= stale_after_s
    )


async def _running(world: World, prompt: str) -> Running:
    task = await world.submit("m-a", prompt)
    await world.scheduler.round()
    await world.settle()
    assert (await world.ledger.get(task.id)).state is State.RUNNING
    return world.scheduler.running[task.id]


def _clock(world: World) -> FakeClock:
    clock = world.ledger.clock
    assert isinstance(clock, FakeClock)
    return clock


async def test_a_run_that_must_beat_and_went_silent_is_reclaimed_and_retried(
    tmp_path: Path,
) -> None:
    async with _world(tmp_path, beats_required=True) as world:
        running = await _running(world, "goes silent")
        _clock(world).advance(world.scheduler.stale_s + 1.0)  # no sign of life since
        await world.scheduler.round()
        await world.settle()

        reclaimed = await world.ledger.get(running.task.id)
        # Back in the queue on its next attempt, and started again on it.
        assert reclaimed.attempt == 2
        assert world.runner.started == ["goes silent", "goes silent"]
        assert world.scheduler.late_beats == 0


async def test_a_live_run_whose_beat_was_late_is_left_running_and_said_once(
    tmp_path: Path,
) -> None:
    # An API run (no beats required: its coroutine is its proof), its beat
    # never written for longer than the stale bound: this host's loop was
    # starved or paused. Two looks find it stale in the store.
    async with _world(tmp_path) as world:
        running = await _running(world, "alive, beat late")
        for _ in range(2):
            _clock(world).advance(world.scheduler.stale_s + 1.0)
            await world.scheduler.round()
            await world.settle()

        task = await world.ledger.get(running.task.id)
        assert (task.state, task.attempt) == (State.RUNNING, 1)
        assert running.ctx.interruption is None
        assert world.scheduler.late_beats == 1  # once a run, not once a look

        world.runner.finish("alive, beat late")
        await world.settle()
        done = await world.ledger.get(running.task.id)
        assert (done.state, done.attempt) == (State.SUCCESS, 1)
        assert world.runner.started == ["alive, beat late"]


async def test_a_run_that_must_beat_and_said_so_lately_is_left_running(
    tmp_path: Path,
) -> None:
    # A web run that proved alive (`ctx.beat`) within the bound, its beat
    # not written (the database slow): not reclaimed.
    async with _world(tmp_path, beats_required=True) as world:
        running = await _running(world, "page alive")
        clock = _clock(world)
        clock.advance(world.scheduler.stale_s + 1.0)
        running.ctx.beat()
        await world.scheduler.round()
        await world.settle()

        task = await world.ledger.get(running.task.id)
        assert (task.state, task.attempt) == (State.RUNNING, 1)
        assert world.scheduler.late_beats == 1

        # Silent for the bound from then on: it hung after all, and is reclaimed.
        clock.advance(world.scheduler.stale_s + 1.0)
        await world.scheduler.round()
        await world.settle()
        assert (await world.ledger.get(running.task.id)).attempt == 2


async def test_a_stale_attempt_another_host_took_up_is_reclaimed_and_ours_stopped(
    tmp_path: Path,
) -> None:
    # This host was paused; meanwhile another host took the task up on its
    # next attempt, and went silent too. That attempt is not ours to keep.
    async with _world(tmp_path) as world:
        running = await _running(world, "taken up elsewhere")
        with sqlite3.connect(tmp_path / "d.db") as db:
            db.execute(
                "UPDATE tasks SET attempt = 2, host = 'other-host' WHERE id = ?",
                (running.task.id,),
            )
        _clock(world).advance(world.scheduler.stale_s + 1.0)
        await world.scheduler.round()
        await world.settle()

        task = await world.ledger.get(running.task.id)
        assert task.attempt == 3  # reclaimed, and taken up again here
        assert world.runner.started == ["taken up elsewhere", "taken up elsewhere"]
        assert running.ctx.interruption is Interruption.RECLAIMED
        assert world.scheduler.late_beats == 0
