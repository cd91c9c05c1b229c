"""The event-loop lag window: the largest lag of the last minute, forgotten after it."""

from __future__ import annotations

from dispatcher.metrics import LagWindow


def test_the_largest_lag_of_the_window_is_reported_until_it_ages_out() -> None:
    window = LagWindow(window_s=60.0)
    assert window.max_s(0.0) == 0.0
    window.add(10.0, 0.002)
    window.add(20.0, 3.5)  # a stall
    window.add(30.0, 0.001)
    window.add(40.0, 0.8)
    assert window.max_s(45.0) == 3.5
    assert window.max_s(79.9) == 3.5
    # A minute after the stall, the next largest lag still in the window.
    assert window.max_s(80.1) == 0.8
    assert window.max_s(100.1) == 0.0


def test_the_window_keeps_few_samples_however_long_it_runs() -> None:
    window = LagWindow(window_s=60.0)
    for i in range(100_000):
        window.add(i * 0.1, 0.001 * (i % 7))
    assert len(window._samples) <= 7
    assert window.max_s(10_000.0) == 0.006
