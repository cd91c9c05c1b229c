"""When to ask again: the poll schedule, in-place retry backoff, Retry-After.

Pure functions. Waits returned here are *nominal* seconds (the caller sleeps
them through the clock, which applies time_scale), except `parse_retry_after`,
whose answer is *real* seconds: a provider's Retry-After is an instruction
about its own wall clock, which no test knob of ours slows down.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from email.utils import parsedate_to_datetime

# A source of uniform floats in [0, 1); injected so tests can pin the jitter.
Rand = Callable[[], float]

FIRST_POLL_WAIT_S = 2.0
POLL_GROWTH = 1.5
MAX_POLL_WAIT_S = 15.0
JITTER = 0.2  # +/-20 %: spreads a batch's polls so they do not arrive in lockstep

FIRST_RETRY_WAIT_S = 1.0
RETRY_GROWTH = 2.0
MAX_RETRY_WAIT_S = 30.0

# Past this many steps the growth has long hit the cap; stopping here keeps
# `growth ** n` from overflowing for tasks that poll for hours.
_MAX_EXPONENT = 64


def jitter_factor(rand: Rand) -> float:
    """A multiplier in [1 - JITTER, 1 + JITTER]."""
    r = min(max(rand(), 0.0), 1.0)
    return 1.0 + JITTER * (2.0 * r - 1.0)


def _capped_growth(first: float, growth: float, cap: float, n: int) -> float:
    return min(first * growth ** min(max(n, 0), _MAX_EXPONENT), cap)


def poll_wait(n: int, rand: Rand) -> float:
    """Nominal seconds to wait before poll number `n` (0 = the first poll)."""
    return _capped_growth(FIRST_POLL_WAIT_S, POLL_GROWTH, MAX_POLL_WAIT_S, n) * jitter_factor(rand)


def retry_wait(n: int, rand: Rand) -> float:
    """Nominal seconds before in-place retry number `n` (0 = the first retry)."""
    return _capped_growth(FIRST_RETRY_WAIT_S, RETRY_GROWTH, MAX_RETRY_WAIT_S, n) * jitter_factor(
        rand
    )


def _non_negative(value: float) -> float | None:
    if math.isnan(value) or math.isinf(value):
        return None
    return max(0.0, value)


def parse_retry_after(headers: Mapping[str, str], now: float) -> float | None:
    """Real seconds the provider asked us to wait, or None when it did not say.

    `retry-after-ms` wins when present: it is the more precise of the two and
    providers that send both mean the same instant. `Retry-After` may be
    delta-seconds or an HTTP-date (compared with `now`, wall-clock epoch s).
    """
    lowered = {key.lower(): value for key, value in headers.items()}
    millis = lowered.get("retry-after-ms")
    if millis is not None:
        try:
            parsed = _non_negative(float(millis.strip()) / 1000.0)
        except ValueError:
            parsed = None
        if parsed is not None:
            return parsed
    value = lowered.get("retry-after")
    if value is None:
        return None
    value = value.strip()
    try:
        return _non_negative(float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # RFC 9110 dates are GMT even when the zone is omitted
        return None
    return _non_negative(when.timestamp() - now)
