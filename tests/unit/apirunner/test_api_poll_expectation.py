"""Polling that knows what to expect: sparse far from a job's end, dense near it."""

from __future__ import annotations

import math
import random

from hypothesis import given
from hypothesis import strategies as st

from apirunner.polling import (
    DENSE_POLL_WAIT_S,
    JITTER,
    MAX_FAR_WAIT_S,
    MAX_POLL_WAIT_S,
    MIN_POLL_WAIT_S,
    PollEvidence,
    ProgressTrack,
    end_window,
    next_poll_wait,
    poll_wait,
)

rands = st.floats(min_value=0.0, max_value=1.0)
any_float = st.floats(allow_nan=True, allow_infinity=True)
durations = st.floats(min_value=5.0, max_value=3600.0)


def simulate(
    duration_s: float, *, history: tuple[float, ...] = (), progress: bool, seed: int
) -> tuple[int, float]:
    """Polls and detection delay for one job whose progress (after a queued
    fifth, like the demo vendor's) is reported as an integer percent."""
    rng = random.Random(seed)
    elapsed, step, track = 0.0, 0, ProgressTrack()
    while True:
        evidence = PollEvidence(step, elapsed, history, track)
        elapsed += next_poll_wait(evidence, rng.random)
        step += 1
        if elapsed >= duration_s:
            return step, elapsed - duration_s
        queued_s = 0.2 * duration_s
        if progress and elapsed > queued_s:
            percent = math.floor(100 * (elapsed - queued_s) / (duration_s - queued_s))
            track = track.observe(elapsed, min(99, percent))


@given(
    step=st.integers(min_value=0, max_value=1000),
    elapsed=any_float,
    r=rands,
    position=st.one_of(st.none(), st.integers(min_value=0, max_value=50)),
)
def test_with_nothing_known_the_wait_is_the_fixed_schedule(
    step: int, elapsed: float, r: float, position: int | None
) -> None:
    evidence = PollEvidence(step, elapsed, queue_position=position)
    assert next_poll_wait(evidence, lambda: r) == poll_wait(step, lambda: r)


@given(
    step=st.integers(min_value=0, max_value=1000),
    elapsed=any_float,
    history=st.lists(any_float, max_size=30),
    readings=st.lists(st.tuples(any_float, any_float), max_size=6),
    position=st.one_of(st.none(), st.integers(min_value=-5, max_value=50)),
    r=any_float,
)
def test_every_wait_is_finite_never_below_the_floor_and_never_above_the_far_cap(
    step: int,
    elapsed: float,
    history: list[float],
    readings: list[tuple[float, float]],
    position: int | None,
    r: float,
) -> None:
    track = ProgressTrack()
    for at, percent in readings:
        track = track.observe(at, percent)
    wait = next_poll_wait(PollEvidence(step, elapsed, tuple(history), track, position), lambda: r)
    assert math.isfinite(wait)
    assert MIN_POLL_WAIT_S <= wait <= MAX_FAR_WAIT_S * (1 + JITTER) + 1e-9


@given(run_s=durations, share=st.floats(min_value=0.0, max_value=0.999), r=rands)
def test_far_from_the_expected_end_it_never_polls_past_the_earliest_end(
    run_s: float, share: float, r: float
) -> None:
    evidence = PollEvidence(3, run_s * share, history_s=(run_s,) * 5)
    window = end_window(evidence)
    assert window is not None
    wait = next_poll_wait(evidence, lambda: r)
    if window.earliest_s - evidence.elapsed_s > DENSE_POLL_WAIT_S:
        assert evidence.elapsed_s + wait <= window.earliest_s + 1e-9


@given(run_s=durations, r=rands, at=st.floats(min_value=0.0, max_value=1.0))
def test_around_the_expected_end_it_polls_densely(run_s: float, r: float, at: float) -> None:
    window = end_window(PollEvidence(0, 0.0, history_s=(run_s,)))
    assert window is not None
    elapsed = window.earliest_s + at * (window.latest_s - window.earliest_s)
    wait = next_poll_wait(PollEvidence(9, elapsed, history_s=(run_s,)), lambda: r)
    assert wait <= max(MIN_POLL_WAIT_S, DENSE_POLL_WAIT_S * (1 + JITTER)) + 1e-9


def test_a_long_job_with_history_is_polled_sparsely_at_first() -> None:
    first = next_poll_wait(PollEvidence(0, 0.0, history_s=(300.0,)), lambda: 0.5)
    assert first > MAX_POLL_WAIT_S  # the fixed schedule would poll after 2 s


def test_still_queued_behind_others_falls_back_to_the_fixed_schedule() -> None:
    evidence = PollEvidence(4, 290.0, history_s=(300.0,), queue_position=3)
    assert next_poll_wait(evidence, lambda: 0.5) == poll_wait(4, lambda: 0.5)


def test_an_overrunning_job_backs_off_to_the_fixed_cap() -> None:
    waits = [
        next_poll_wait(PollEvidence(20, elapsed, history_s=(60.0,)), lambda: 0.5)
        for elapsed in (70.0, 90.0, 200.0, 5000.0)
    ]
    assert waits == sorted(waits)
    assert waits[-1] == MAX_POLL_WAIT_S


@given(
    start_s=st.floats(min_value=0.0, max_value=200.0),
    run_s=st.floats(min_value=20.0, max_value=2000.0),
    times=st.lists(st.floats(min_value=0.0, max_value=1.0), min_size=2, max_size=8),
)
def test_integer_progress_brackets_the_true_end(
    start_s: float, run_s: float, times: list[float]
) -> None:
    track = ProgressTrack()
    for t in sorted(times):
        at = start_s + t * run_s
        track = track.observe(at, min(99, math.floor(100 * t)))
    window = end_window(PollEvidence(0, 0.0, progress=track))
    if window is not None:
        assert window.source == "progress"
        assert window.earliest_s <= start_s + run_s + 1e-6 <= window.latest_s + 2e-6


def test_progress_going_backwards_forgets_the_old_readings() -> None:
    track = ProgressTrack().observe(10.0, 20.0).observe(20.0, 40.0).observe(30.0, 5.0)
    assert track == ProgressTrack()
    assert ProgressTrack().observe(5.0, 0.0) == ProgressTrack()  # 0 % says nothing yet


def test_five_minute_jobs_cost_a_tenth_of_fixed_polling_and_are_noticed_within_2s() -> None:
    fixed_requests = 300 + 2  # submit, a poll a second, download
    for lane in ("warm", "cold"):
        runs = [
            simulate(300.0, history=(301.0,) * 5 if lane == "warm" else (), progress=True, seed=s)
            for s in range(200)
        ]
        requests = sum(polls + 2 for polls, _ in runs) / len(runs)
        delay = sum(d for _, d in runs) / len(runs)
        assert requests <= 0.1 * fixed_requests, lane
        assert delay <= 2.0, lane


def test_without_progress_or_history_the_delay_is_the_fixed_schedules() -> None:
    runs = [simulate(120.0, progress=False, seed=s) for s in range(200)]
    assert sum(d for _, d in runs) / len(runs) > 2.0  # why history and progress matter
