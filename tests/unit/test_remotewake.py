"""Another host's pending task wakes this host only if nobody claimed it within a grace."""

from __future__ import annotations

import asyncio

from dispatcher.clock import SystemClock
from dispatcher.scheduling.remotewake import GRACE_S, RemotePending, RemoteWakes, WakeCheck


def test_a_task_claimed_within_its_grace_wakes_nobody() -> None:
    pending = RemotePending(grace_s=0.25)
    assert pending.heard_pending("a", now=10.0)  # the first: a check is due
    assert not pending.heard_pending("a", now=10.1)  # heard again: kept once
    pending.left("a")  # its own host claimed it
    pending.left("b")  # heard leaving pending alone (both notices in one read)
    assert pending.check(now=10.25) == WakeCheck(wake=False, next_check_in_s=None)
    assert pending.heard == 1 and pending.spared == 1 and len(pending) == 0


def test_a_task_still_pending_after_its_grace_wakes_once() -> None:
    pending = RemotePending(grace_s=0.25)
    pending.heard_pending("a", now=10.0)
    assert pending.check(now=10.125) == WakeCheck(wake=False, next_check_in_s=0.125)
    assert pending.check(now=10.25) == WakeCheck(wake=True, next_check_in_s=None)
    # Told once: the round claims whatever is first in line.
    assert pending.check(now=11.0) == WakeCheck(wake=False, next_check_in_s=None)


def test_the_next_check_is_the_oldest_waiting_tasks_grace() -> None:
    pending = RemotePending(grace_s=0.25)
    pending.heard_pending("a", now=10.0)
    assert not pending.heard_pending("b", now=10.0625)  # a check is armed already
    pending.heard_pending("c", now=10.125)
    pending.left("b")
    check = pending.check(now=10.25)  # "a" is due, "c" is not
    assert check.wake and check.next_check_in_s is not None
    assert check.next_check_in_s == 0.125
    pending.left("c")
    assert pending.check(now=10.5) == WakeCheck(wake=False, next_check_in_s=None)


def test_a_task_heard_pending_again_keeps_its_first_time() -> None:
    pending = RemotePending(grace_s=0.25)
    pending.heard_pending("a", now=10.0)
    pending.heard_pending("a", now=10.125)
    assert pending.check(now=10.25).wake


def test_past_the_cap_the_oldest_is_dropped_and_the_next_check_wakes() -> None:
    pending = RemotePending(grace_s=0.25, kept_max=2)
    pending.heard_pending("a", now=10.0)
    pending.heard_pending("b", now=10.0)
    pending.heard_pending("c", now=10.0)
    assert len(pending) == 2
    pending.left("b")
    pending.left("c")  # all heard leaving, but "a" was dropped unheard
    assert pending.check(now=10.0625) == WakeCheck(wake=True, next_check_in_s=None)


async def test_the_loop_timer_wakes_after_the_grace_unless_the_task_left() -> None:
    clock = SystemClock(time_scale=0.01)
    woken: list[float] = []
    told = asyncio.Event()

    def wake() -> None:
        woken.append(clock.monotonic())
        told.set()

    wakes = RemoteWakes(clock, wake)
    assert wakes.pending.grace_s == GRACE_S  # a real delay: not scaled

    heard_at = clock.monotonic()
    wakes.heard_pending("claimed elsewhere")
    wakes.left("claimed elsewhere")
    wakes.heard_pending("left pending")
    await asyncio.wait_for(told.wait(), timeout=2.0)
    # (less a timer's rounding: the loop may run a timer a hair early)
    assert len(woken) == 1 and woken[0] - heard_at >= wakes.pending.grace_s - 0.005
    await asyncio.sleep(wakes.pending.grace_s * 3)
    assert len(woken) == 1

    wakes.heard_pending("after close")
    wakes.close()
    await asyncio.sleep(wakes.pending.grace_s * 3)
    assert len(woken) == 1
