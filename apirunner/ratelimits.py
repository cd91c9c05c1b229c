"""A vendor's rate-limit headers (`[api.rate_limit]`) as a wait. Pure functions.

`x-ratelimit-remaining-*` at 0 means the next request would be refused
until `x-ratelimit-reset-*`: the lane's gate holds every request until
then, instead of spending a request (and the vendor's patience) on a 429.
Waits are *real* seconds, like Retry-After: the vendor's clock, not ours.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

from dispatcher.profile_extras import RateLimitSpec

# "6m0s", "1h2m3.5s", "20ms": the duration form some vendors use.
_DURATION = re.compile(r"(?:(\d+(?:\.\d+)?)(h|ms|m|s))")
# Past this a number is an epoch time, not a delta (a delta of 31 years is no limit).
_EPOCH_FROM = 1_000_000_000.0
MAX_RESET_S = 3600.0  # a vendor's header never holds the lane longer than this


def parse_reset(value: str, now: float) -> float | None:
    """Real seconds until `value` (delta seconds, a duration, or epoch s/ms)."""
    text = value.strip().lower()
    if not text:
        return None
    try:
        number = float(text)
    except ValueError:
        number = math.nan
    if math.isfinite(number):
        if number >= _EPOCH_FROM * 1000:  # epoch milliseconds
            number = number / 1000 - now
        elif number >= _EPOCH_FROM:
            number -= now
        return min(max(0.0, number), MAX_RESET_S)
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    unit_s = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    total = sum(float(n) * unit_s[u] for n, u in parts)
    return min(total, MAX_RESET_S)


def _header(headers: Mapping[str, str], name: str) -> str | None:
    lowered = name.lower()
    for key, value in headers.items():
        if key.lower() == lowered:
            return value
    return None


def limit_wait(
    spec: RateLimitSpec | None, headers: Mapping[str, str], now: float, *, refused: bool
) -> float | None:
    """Real seconds to hold the lane, or None: when `remaining` reads 0, or
    when the answer was a 429 (`refused`) and `reset` says when it lifts."""
    if spec is None:
        return None
    if not refused:
        if spec.remaining is None:
            return None
        remaining = _header(headers, spec.remaining)
        try:
            if remaining is None or float(remaining) > 0:
                return None
        except ValueError:
            return None
    reset = _header(headers, spec.reset)
    return None if reset is None else parse_reset(reset, now)
