"""Issue 30's pure decisions: what a task costs, what a budget lets start, and
the order a queue is served in (no task starves: property-tested)."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dispatcher.errors import ConfigError
from dispatcher.pricing import (
    AGING_STEP_S,
    Pricing,
    budget_reason,
    day_start,
    effective_priority,
    estimate_cost_usd,
    finished_cost_usd,
    fits_budget,
    is_late,
    next_day_start,
    order_key,
    parse_budgets,
    reported_cost_usd,
)


def test_a_price_table_adds_its_parts_from_the_params() -> None:
    video = Pricing(per_request=0.05, per_output_second=0.10)
    assert estimate_cost_usd(video, {"prompt": "a cat", "duration": 8}) == pytest.approx(0.85)
    # No duration asked: the table's default seconds (0 unless stated).
    assert estimate_cost_usd(video, {"prompt": "a cat"}) == pytest.approx(0.05)
    images = Pricing(per_image=0.04, per_megapixel=0.01, by_param={"quality": {"hd": 0.04}})
    cost = estimate_cost_usd(images, {"n": 3, "size": "1024x1024", "quality": "hd"})
    assert cost == pytest.approx(0.12 + 0.01 * 1.048576 + 0.04, abs=1e-6)  # to 6 places
    assert estimate_cost_usd(images, {"width": 2000, "height": 1000}) == pytest.approx(0.06)
    # A model without prices has no estimate (not "free").
    assert estimate_cost_usd(None, {"duration": 8}) is None


def test_untrusted_params_and_answers_cannot_make_a_cost_negative_or_endless() -> None:
    video = Pricing(per_output_second=0.10)
    assert estimate_cost_usd(video, {"duration": -50}) == 0.0
    assert estimate_cost_usd(video, {"duration": "ten"}) == 0.0
    assert estimate_cost_usd(video, {"duration": 10**12}) == 10_000.0
    usage = Pricing(usage_cost="usage.cost_usd")
    assert reported_cost_usd(usage, {"usage": {"cost_usd": 0.42}}) == 0.42
    assert reported_cost_usd(usage, {"usage": {"cost_usd": "nan"}}) is None
    assert reported_cost_usd(usage, {"usage": {"cost_usd": -1}}) is None
    assert reported_cost_usd(usage, {"usage": []}) is None
    assert reported_cost_usd(Pricing(), {"usage": {"cost_usd": 1}}) is None
    # A finished task: the usage its runner found, else the estimate.
    assert finished_cost_usd(0.5, {"text": "hi", "meta": {"cost_usd": 0.42}}) == 0.42
    assert finished_cost_usd(0.5, {"text": "hi", "meta": {"cost_usd": True}}) == 0.5
    assert finished_cost_usd(None, {"text": "hi"}) is None


def test_budgets_setting_and_the_day_they_count() -> None:
    assert parse_budgets("acme-video=50, demo=$12.5") == {"acme-video": 50.0, "demo": 12.5}
    with pytest.raises(ConfigError, match="provider=dollars"):
        parse_budgets("acme-video:50")
    moment = datetime(2026, 12, 3, 15, 30, tzinfo=UTC).timestamp()
    assert day_start(moment) == datetime(2026, 12, 3, tzinfo=UTC).timestamp()
    assert next_day_start(moment) == datetime(2026, 12, 4, tzinfo=UTC).timestamp()
    assert fits_budget(spent_usd=48.2, cost_usd=1.8, limit_usd=50.0)
    assert not fits_budget(spent_usd=48.2, cost_usd=1.9, limit_usd=50.0)
    assert budget_reason("acme-video", 48.2, 50) == "budget acme-video/day: $48.20 of $50.00 spent"


def test_a_task_is_late_once_it_cannot_finish_by_its_deadline() -> None:
    assert is_late(deadline=100.0, now=90.0, expected_run_s=20.0)
    assert not is_late(deadline=100.0, now=70.0, expected_run_s=20.0)
    assert not is_late(deadline=None, now=1e12)


_tasks = st.lists(
    st.tuples(
        st.integers(-5, 5),  # priority
        st.one_of(st.none(), st.floats(0, 10_000)),  # deadline
        st.floats(0, 10_000),  # created_at
    ),
    min_size=1,
    max_size=30,
)


@given(_tasks, st.floats(10_000, 20_000))
def test_order_is_priority_then_deadline_then_fifo_among_equal_waits(
    tasks: list[tuple[int, float | None, float]], now: float
) -> None:
    keys = sorted(
        order_key(priority=p, deadline=d, seq=seq, created_at=0.0, now=now)
        for seq, (p, d, _) in enumerate(tasks)
    )
    for first, second in itertools.pairwise(keys):
        # Same wait: a higher priority is never served after a lower one...
        assert first[0] <= second[0]
        # ...an earlier deadline never after a later one of equal priority...
        if first[0] == second[0]:
            assert first[1] <= second[1]
            # ...and among equals, first come first served.
            if first[1] == second[1]:
                assert first[2] < second[2]


@given(
    low=st.integers(-1000, 1000),
    high=st.integers(-1000, 1000),
    created_at=st.floats(0, 1e6),
    later_s=st.floats(0, 1e6),
    since_s=st.floats(0, 1e6),
)
def test_no_task_starves_behind_later_higher_priority_work(
    low: int, high: int, created_at: float, later_s: float, since_s: float
) -> None:
    """The stated rule: a task outranks every task of priority `high` submitted
    more than (high - low + 1) aging steps after it, at any later time. So it
    yields only to the finite work submitted within that window: it runs."""
    window_s = max(0, high - low + 1) * AGING_STEP_S
    fresh_at = created_at + window_s + 1.0 + later_s
    now = fresh_at + since_s
    waiting = order_key(priority=low, deadline=None, seq=1, created_at=created_at, now=now)
    fresh = order_key(priority=high, deadline=0.0, seq=2, created_at=fresh_at, now=now)
    assert waiting < fresh
    # Waiting never lowers a task's rank.
    assert effective_priority(low, since_s) >= low
