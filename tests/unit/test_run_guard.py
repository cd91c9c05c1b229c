"""`RunContext.guard` and `RunContext.interrupt`: the one cancel path of every runner."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from dispatcher.clock import FakeClock
from dispatcher.errors import TaskCanceled, TransientError
from dispatcher.models import Kind, Task
from dispatcher.scheduling.protocol import Interruption, RunContext
from dispatcher.testing import run_context
from tests.support.helpers import api_profile


def context(tmp_path: Path, clock: FakeClock | None = None) -> RunContext:
    task = Task(
        id="t1",
        model="m-api",
        kind=Kind.API,
        queue="api-model:m-api",
        params={"prompt": "p"},
        fingerprint="f",
        created_at=0.0,
    )
    return run_context(
        task, api_profile(), owner="prov", result_dir=tmp_path, clock=clock or FakeClock()
    )


def pending_cancels() -> int:
    task = asyncio.current_task()
    assert task is not None
    return task.cancelling()


async def test_work_that_ends_by_itself_returns_its_result_and_beats(tmp_path: Path) -> None:
    clock = FakeClock()
    ctx = context(tmp_path, clock)
    clock.advance(5.0)

    async def answer() -> int:
        return 42

    assert await ctx.guard(answer()) == 42
    assert ctx.last_beat_monotonic == clock.monotonic()


async def test_a_cancel_before_the_work_starts_never_starts_it(tmp_path: Path) -> None:
    ctx = context(tmp_path)
    started = False

    async def work() -> None:
        nonlocal started
        started = True

    ctx.interrupt(Interruption.CANCELED)
    with pytest.raises(TaskCanceled):
        await ctx.guard(work())  # closed unstarted: no "never awaited" warning
    assert not started
    with pytest.raises(TaskCanceled):
        ctx.check_canceled()


async def test_a_cancel_during_the_work_unwinds_it_at_once(tmp_path: Path) -> None:
    ctx = context(tmp_path)
    waiting, unwound = asyncio.Event(), asyncio.Event()

    async def forever() -> None:
        waiting.set()
        try:
            await asyncio.Event().wait()
        finally:
            unwound.set()

    run = asyncio.create_task(ctx.guard(forever()))
    await waiting.wait()
    ctx.interrupt(Interruption.CANCELED)
    with pytest.raises(TaskCanceled):
        await run
    assert unwound.is_set()  # not left running behind the raise
    assert not run.cancelled()  # an operator's cancel is an exception, not a cancellation


async def test_a_frozen_future_is_cancelled_with_the_guard(tmp_path: Path) -> None:
    ctx = context(tmp_path)
    frozen: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    run = asyncio.create_task(ctx.guard(frozen))
    await asyncio.sleep(0)
    ctx.interrupt(Interruption.CANCELED)
    with pytest.raises(TaskCanceled):
        await run
    assert frozen.cancelled()


async def test_a_cancel_after_the_work_leaves_its_result_and_stops_the_next_step(
    tmp_path: Path,
) -> None:
    ctx = context(tmp_path)

    async def answer() -> str:
        return "done"

    assert await ctx.guard(answer()) == "done"
    ctx.interrupt(Interruption.CANCELED)
    assert pending_cancels() == 0  # nothing was guarded: nothing to cut
    with pytest.raises(TaskCanceled):
        await ctx.guard(answer())


async def test_the_budget_ends_the_work_with_a_clear_error(tmp_path: Path) -> None:
    ctx = context(tmp_path)
    frozen: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    with pytest.raises(TransientError) as caught:
        await ctx.guard(frozen, 0.01, what="reading the answer", budget_label="the 600 s timeout")
    assert caught.value.kind == "timeout"
    assert str(caught.value) == "timed out after the 600 s timeout while reading the answer"
    assert frozen.cancelled()
    assert pending_cancels() == 0


async def test_a_spent_budget_refuses_to_start_and_names_the_seconds(tmp_path: Path) -> None:
    ctx = context(tmp_path)
    started = False

    async def work() -> None:
        nonlocal started
        started = True

    with pytest.raises(TransientError, match=r"^timed out after 0 s while waiting$"):
        await ctx.guard(work(), 0.0)
    assert not started


async def test_a_timeout_of_the_work_itself_is_not_the_budget(tmp_path: Path) -> None:
    ctx = context(tmp_path)

    async def own_timeout() -> None:
        raise TimeoutError("the vendor's read timed out")

    with pytest.raises(TimeoutError, match="vendor"):
        await ctx.guard(own_timeout(), 60.0)


async def test_nested_guards_end_together_and_leave_no_cancel_behind(tmp_path: Path) -> None:
    ctx = context(tmp_path)
    waiting = asyncio.Event()
    seen: list[str] = []

    async def inner() -> None:
        waiting.set()
        await asyncio.Event().wait()

    async def outer() -> None:
        try:
            await ctx.guard(inner(), 30.0)
        except TaskCanceled:
            seen.append("inner")
            # Cleanup after a cancel still works: a timeout in this task is
            # not confused by a cancel request left over from ours.
            assert pending_cancels() == 0
            async with asyncio.timeout(0.01):
                await asyncio.Event().wait()

    run = asyncio.create_task(ctx.guard(outer()))
    await waiting.wait()
    ctx.interrupt(Interruption.CANCELED)
    with pytest.raises(TimeoutError):  # the cleanup's own timeout, as a timeout
        await run
    assert seen == ["inner"]


async def test_guards_in_several_tasks_all_end_on_one_cancel(tmp_path: Path) -> None:
    ctx = context(tmp_path)
    ready = [asyncio.Event(), asyncio.Event()]

    async def look(i: int) -> None:
        ready[i].set()
        await asyncio.Event().wait()

    looks = [asyncio.create_task(ctx.guard(look(i))) for i in range(2)]
    for event in ready:
        await event.wait()
    ctx.interrupt(Interruption.CANCELED)
    outcomes = await asyncio.gather(*looks, return_exceptions=True)
    assert [type(o) for o in outcomes] == [TaskCanceled, TaskCanceled]


async def test_work_that_swallows_the_interrupt_keeps_its_result(tmp_path: Path) -> None:
    ctx = context(tmp_path)
    waiting = asyncio.Event()

    async def stubborn() -> str:
        waiting.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            return "finished anyway"
        return "never"

    async def step() -> tuple[str, int]:
        result = await ctx.guard(stubborn())
        return result, pending_cancels()

    run = asyncio.create_task(step())
    await waiting.wait()
    ctx.interrupt(Interruption.CANCELED)
    assert await run == ("finished anyway", 0)  # and no stray cancel left in the task


async def test_a_cancel_while_the_final_write_runs_does_not_lose_the_write(
    tmp_path: Path,
) -> None:
    ctx = context(tmp_path)
    writing, may_finish = asyncio.Event(), asyncio.Event()
    written: list[str] = []

    async def write(what: str) -> None:
        writing.set()
        await may_finish.wait()
        written.append(what)

    async def run() -> None:
        # The final write is not guarded: a cancel must not cut it in half.
        await write("result")
        ctx.check_canceled()

    job = asyncio.create_task(run())
    await writing.wait()
    ctx.interrupt(Interruption.CANCELED)
    may_finish.set()
    with pytest.raises(TaskCanceled):
        await job
    assert written == ["result"]

    # A write shielded inside a guard: the guard ends at once, the write does not.
    ctx = context(tmp_path)
    writing.clear()
    may_finish.clear()
    shielded = asyncio.ensure_future(write("remote id"))
    guarded = asyncio.create_task(ctx.guard(asyncio.shield(shielded)))
    await writing.wait()
    ctx.interrupt(Interruption.CANCELED)
    with pytest.raises(TaskCanceled):
        await guarded
    may_finish.set()
    await shielded
    assert written == ["result", "remote id"]


async def test_a_cancel_from_the_guarded_task_itself_waits_for_the_next_step(
    tmp_path: Path,
) -> None:
    ctx = context(tmp_path)

    async def cancels_itself() -> str:
        ctx.interrupt(Interruption.CANCELED)
        await asyncio.sleep(0)  # no interrupt of its own task: it is not waiting
        return "finished"

    assert await ctx.guard(cancels_itself()) == "finished"
    assert pending_cancels() == 0
    with pytest.raises(TaskCanceled):
        ctx.check_canceled()


@pytest.mark.parametrize("reason", [Interruption.SHUTDOWN, Interruption.RECLAIMED])
async def test_shutdown_and_reclaim_cancel_the_whole_run_as_an_asyncio_cancel(
    tmp_path: Path, reason: Interruption
) -> None:
    ctx = context(tmp_path)
    waiting = asyncio.Event()

    async def forever() -> None:
        waiting.set()
        await asyncio.Event().wait()

    ctx.work = asyncio.create_task(ctx.guard(forever()))
    await waiting.wait()
    ctx.interrupt(reason)
    with pytest.raises(asyncio.CancelledError):
        await ctx.work
    assert ctx.interruption is reason and reason.withdraws
    ctx.interrupt(Interruption.CANCELED)  # too late: it writes no verdict either way
    assert ctx.interruption is reason and not ctx.canceled


async def test_a_shutdown_after_a_cancel_stays_a_shutdown(tmp_path: Path) -> None:
    ctx = context(tmp_path)
    waiting, cleaning = asyncio.Event(), asyncio.Event()

    async def forever() -> None:
        waiting.set()
        await asyncio.Event().wait()

    async def run() -> None:
        try:
            await ctx.guard(forever())
        except TaskCanceled:
            cleaning.set()  # e.g. closing the browser, when the service stops
            await asyncio.Event().wait()

    ctx.work = asyncio.create_task(run())
    await waiting.wait()
    ctx.interrupt(Interruption.CANCELED)
    await cleaning.wait()
    ctx.interrupt(Interruption.SHUTDOWN)
    with pytest.raises(asyncio.CancelledError):
        await ctx.work
    assert ctx.interruption is Interruption.SHUTDOWN


async def test_an_alive_wait_counts_as_beating_while_it_lasts(tmp_path: Path) -> None:
    clock = FakeClock()
    ctx = context(tmp_path, clock)
    release = asyncio.Event()
    beats: list[float] = []

    async def launch() -> None:
        clock.advance(30.0)
        beats.append(ctx.last_beat_monotonic)
        await release.wait()

    async def page_call() -> None:
        clock.advance(30.0)
        beats.append(ctx.last_beat_monotonic)
        await release.wait()

    release.set()
    await ctx.guard(launch(), alive=True)
    await ctx.guard(page_call())
    assert beats == [30.0, 30.0]  # a page call proves nothing until it returns
    assert ctx.last_beat_monotonic == 60.0


# -- a reclaim or a shutdown whose cancel is lost ----------------------------------
# On Python 3.11 `asyncio.wait_for` returns its inner result, and swallows the
# cancel, when its inner wait completed in the turn the cancel arrives
# (psycopg_pool waits for a connection that way; see dispatcher.background).
# Each test below completes that inner wait and interrupts in one turn; the
# run must still end promptly, not at its next natural end (an hour here).


def _lose_the_cancel(ctx: RunContext, inner: asyncio.Future[str], why: Interruption) -> None:
    """Complete the inner wait and interrupt the run in one turn of the loop."""
    inner.set_result("connection")
    ctx.interrupt(why)


async def _ended(job: asyncio.Task[None]) -> bool:
    # A hang guard only: on the fixed code the job ends within a few turns.
    done, _ = await asyncio.wait({job}, timeout=5)
    return job in done


@pytest.mark.parametrize("reason", [Interruption.SHUTDOWN, Interruption.RECLAIMED])
async def test_a_lost_cancel_ends_the_run_at_the_guard_that_lost_it(
    tmp_path: Path, reason: Interruption
) -> None:
    ctx = context(tmp_path)
    inner: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    steps: list[str] = []

    async def run() -> None:
        steps.append(await ctx.guard(asyncio.wait_for(inner, timeout=3600)))
        steps.append("polling")
        await ctx.guard(asyncio.sleep(3600))  # the next natural end

    ctx.work = asyncio.create_task(run())
    await asyncio.sleep(0)
    _lose_the_cancel(ctx, inner, reason)
    assert await _ended(ctx.work)
    assert ctx.work.cancelled()
    assert steps == []  # the swallowed wait's result was not acted on


async def test_a_lost_cancel_outside_any_guard_ends_the_run_at_its_next_guard(
    tmp_path: Path,
) -> None:
    ctx = context(tmp_path)
    inner: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    started: list[str] = []

    async def poll() -> None:
        started.append("poll")
        await asyncio.sleep(3600)

    async def run() -> None:
        await asyncio.wait_for(inner, timeout=3600)  # not guarded: reading references, say
        await ctx.guard(poll())

    ctx.work = asyncio.create_task(run())
    await asyncio.sleep(0)
    _lose_the_cancel(ctx, inner, Interruption.SHUTDOWN)
    assert await _ended(ctx.work)
    assert ctx.work.cancelled()
    assert started == []  # refused before it started (and closed: no warning)


async def test_a_guarded_wait_that_lost_the_cancel_and_waits_on_is_cancelled_again(
    tmp_path: Path,
) -> None:
    ctx = context(tmp_path)
    loop = asyncio.get_running_loop()
    first: asyncio.Future[str] = loop.create_future()
    second: asyncio.Future[str] = loop.create_future()
    heard: list[str] = []

    async def connections() -> None:
        # A library loop inside one guarded wait: the cancel is lost in its
        # first wait, and it goes on to wait again.
        for inner in (first, second):
            heard.append(await asyncio.wait_for(inner, timeout=3600))

    async def run() -> None:
        await ctx.guard(connections())

    ctx.work = asyncio.create_task(run())
    await asyncio.sleep(0)
    _lose_the_cancel(ctx, first, Interruption.RECLAIMED)
    assert await _ended(ctx.work)
    assert ctx.work.cancelled()
    assert heard == ["connection"]  # it did lose the first cancel
    assert not second.done() or second.cancelled()


def test_cleanup_after_the_outcome_counts_as_alive_until_it_ends(tmp_path: Path) -> None:
    clock = FakeClock()
    ctx = context(tmp_path, clock)
    before = ctx.last_beat_monotonic
    clock.advance(100.0)
    assert ctx.last_beat_monotonic == before  # silent: the stale rule may take it
    with ctx.alive():
        clock.advance(100.0)
        assert ctx.last_beat_monotonic == clock.monotonic()
    clock.advance(100.0)
    assert ctx.last_beat_monotonic == before  # no beat of its own once it is over
