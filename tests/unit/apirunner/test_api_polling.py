"""The poll schedule, in-place retry backoff and Retry-After parsing."""

from __future__ import annotations

import math
from email.utils import formatdate

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from apirunner.polling import (
    FIRST_POLL_WAIT_S,
    JITTER,
    MAX_POLL_WAIT_S,
    POLL_GROWTH,
    jitter_factor,
    parse_retry_after,
    poll_wait,
    retry_wait,
)

NOW = 1_700_000_000.0


def middle() -> float:
    return 0.5  # jitter factor exactly 1


def test_schedule_starts_at_2s_grows_by_half_and_caps_at_15s() -> None:
    waits = [poll_wait(n, middle) for n in range(8)]
    assert waits == pytest.approx([2.0, 3.0, 4.5, 6.75, 10.125, 15.0, 15.0, 15.0])


def test_schedule_never_overflows_for_very_long_jobs() -> None:
    assert poll_wait(10_000, middle) == MAX_POLL_WAIT_S


def test_jitter_extremes_are_plus_minus_20_percent() -> None:
    assert jitter_factor(lambda: 0.0) == pytest.approx(0.8)
    assert jitter_factor(lambda: 1.0) == pytest.approx(1.2)
    assert poll_wait(0, lambda: 0.0) == pytest.approx(1.6)
    assert poll_wait(20, lambda: 1.0) == pytest.approx(18.0)


@given(n=st.integers(min_value=0, max_value=500), r=st.floats(min_value=0.0, max_value=1.0))
def test_every_wait_is_within_20_percent_of_its_nominal_step(n: int, r: float) -> None:
    nominal = min(FIRST_POLL_WAIT_S * POLL_GROWTH ** min(n, 64), MAX_POLL_WAIT_S)
    wait = poll_wait(n, lambda: r)
    assert nominal * (1 - JITTER) - 1e-9 <= wait <= nominal * (1 + JITTER) + 1e-9


@given(r=st.floats(allow_nan=True, allow_infinity=True))
def test_a_misbehaving_random_source_cannot_push_jitter_out_of_bounds(r: float) -> None:
    factor = jitter_factor(lambda: r)
    assert math.isnan(r) or 0.8 - 1e-9 <= factor <= 1.2 + 1e-9


def test_in_place_retry_backoff_doubles_and_caps() -> None:
    assert [retry_wait(n, middle) for n in range(7)] == pytest.approx([1, 2, 4, 8, 16, 30, 30])


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"Retry-After": "3"}, 3.0),
        ({"retry-after": "0"}, 0.0),
        ({"Retry-After": " 2.5 "}, 2.5),
        ({"retry-after-ms": "1500"}, 1.5),
        ({"Retry-After-Ms": "20"}, 0.02),
        ({"retry-after-ms": "250", "Retry-After": "1"}, 0.25),  # the precise one wins
        ({"retry-after-ms": "soon", "Retry-After": "4"}, 4.0),
        ({"Retry-After": "-5"}, 0.0),
        ({"Retry-After": "tomorrow"}, None),
        ({"Retry-After": "inf"}, None),
        ({}, None),
    ],
)
def test_retry_after_forms(headers: dict[str, str], expected: float | None) -> None:
    found = parse_retry_after(headers, NOW)
    assert found == (None if expected is None else pytest.approx(expected))


def test_retry_after_http_date_is_relative_to_now() -> None:
    headers = {"Retry-After": formatdate(NOW + 12, usegmt=True)}
    assert parse_retry_after(headers, NOW) == pytest.approx(12.0)
    assert parse_retry_after(headers, NOW + 20) == 0.0  # already past: go now


def test_retry_after_from_httpx_headers() -> None:
    headers = httpx.Headers({"Retry-After": "7"})
    assert parse_retry_after(headers, NOW) == 7.0
