"""When to ask again: the poll schedule, in-place retry backoff, Retry-After.

Pure functions. Waits returned here are *nominal* seconds (the caller sleeps
them through the clock, which applies time_scale), except `parse_retry_after`,
whose answer is *real* seconds: a provider's Retry-After is an instruction
about its own wall clock, which no test knob of ours slows down.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
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


# -- polling that knows what to expect -------------------------------------------
# The fixed schedule above is what we do when nothing is known about a job.
# When something is (how long this model took for the same shape of job, the
# provider's progress), `next_poll_wait` polls sparsely until the job could
# first be done and densely from then on: a finished job is noticed within
# about a dense step, at a fraction of a fixed poller's requests.

DENSE_POLL_WAIT_S = 1.5  # +/-20 %: a finish is noticed ~0.75 s late on average
MIN_POLL_WAIT_S = 1.0  # never faster than a fixed 1 s poller, whatever we believe
MAX_FAR_WAIT_S = 60.0  # a job that fails early is still noticed within a minute
FAR_SHARE = 0.2  # far from the end, wait at most this share of the expected run
# History is of whole runs (submit, poll, download, writes); a job of the same
# shape can be this much quicker before we would poll late.
HISTORY_EARLY_SHARE = 0.05
HISTORY_EARLY_S = 1.0
# Past the latest expected end, how fast the waits grow back towards the cap:
# this share of the time overdue (a job that overruns by a minute is polled
# about every 12-15 s, as with the fixed schedule).
OVERDUE_SHARE = 0.2
# Progress readings closer than this (percentage points) say too little about
# the rate; a provider's integer percent is off by up to one point.
MIN_PROGRESS_SPAN = 3.0
PROGRESS_ROUNDING = 1.0
MAX_HISTORY = 64


@dataclass(frozen=True)
class ProgressTrack:
    """The provider's progress readings worth keeping: the first one above 0
    and the latest, as (elapsed nominal s, percent); a longer baseline gives
    a better rate."""

    first: tuple[float, float] | None = None
    last: tuple[float, float] | None = None

    def observe(self, elapsed_s: float, percent: float | None) -> ProgressTrack:
        if percent is None or not math.isfinite(percent) or not math.isfinite(elapsed_s):
            return self
        reading = (elapsed_s, min(100.0, max(0.0, percent)))
        if reading[1] <= 0.0:
            return self
        if self.last is not None and reading[1] < self.last[1]:
            return ProgressTrack()  # progress went backwards: a restart, start over
        return ProgressTrack(first=self.first or reading, last=reading)


@dataclass(frozen=True)
class PollEvidence:
    """What is known about a remote job when choosing the wait before a poll."""

    step: int  # waits so far (0 before the first poll)
    elapsed_s: float  # nominal seconds since the job was submitted
    history_s: tuple[float, ...] = ()  # nominal run times of recent jobs of its shape
    progress: ProgressTrack = ProgressTrack()
    queue_position: int | None = None


@dataclass(frozen=True)
class EndWindow:
    """When the job could first be done and when it should be done by (elapsed s)."""

    earliest_s: float
    latest_s: float
    source: str  # "history" or "progress"


def _clean_history(history_s: tuple[float, ...]) -> list[float]:
    return [h for h in history_s[:MAX_HISTORY] if math.isfinite(h) and h > 0]


def end_window(evidence: PollEvidence) -> EndWindow | None:
    """The expected end from progress (this job's own) or else from history."""
    first, last = evidence.progress.first, evidence.progress.last
    if first is not None and last is not None and last[1] - first[1] >= MIN_PROGRESS_SPAN:
        span_s = last[0] - first[0]
        if span_s > 0:
            fastest = (last[1] - first[1] + PROGRESS_ROUNDING) / span_s
            slowest = (last[1] - first[1] - PROGRESS_ROUNDING) / span_s
            left = max(0.0, 100.0 - last[1] - PROGRESS_ROUNDING)
            return EndWindow(
                earliest_s=last[0] + left / fastest,
                latest_s=last[0] + (100.0 - last[1]) / slowest,
                source="progress",
            )
    history = _clean_history(evidence.history_s)
    if history:
        return EndWindow(
            earliest_s=min(history) * (1 - HISTORY_EARLY_SHARE) - HISTORY_EARLY_S,
            latest_s=max(history) * (1 + HISTORY_EARLY_SHARE) + HISTORY_EARLY_S,
            source="history",
        )
    return None


def next_poll_wait(evidence: PollEvidence, rand: Rand) -> float:
    """Nominal seconds to wait before the next poll of a remote job.

    Nothing known (no history, no usable progress) or still queued behind
    others: the fixed schedule, `poll_wait(step)`. Otherwise sparse (at most
    FAR_SHARE of the expected run, MAX_FAR_WAIT_S) until the earliest
    expected end, landing up to one dense step before it; dense
    (DENSE_POLL_WAIT_S) until the latest expected end; then growing back to
    the fixed schedule's cap as the job overruns. Never below
    MIN_POLL_WAIT_S. A provider's Retry-After is not seen here: the gate
    holds every request back for it, so it stays a floor whatever this says.
    """
    drawn = rand()
    # A jitter source outside [0, 1] (or NaN) must not turn into a NaN wait.
    r = min(max(drawn, 0.0), 1.0) if math.isfinite(drawn) else 0.5
    window = end_window(evidence)
    queued = evidence.queue_position is not None and evidence.queue_position > 0
    if window is None or (queued and window.source == "history"):
        return poll_wait(evidence.step, lambda: r)
    elapsed = max(0.0, evidence.elapsed_s) if math.isfinite(evidence.elapsed_s) else 0.0
    to_earliest = window.earliest_s - elapsed
    if to_earliest > DENSE_POLL_WAIT_S:
        far_cap = min(MAX_FAR_WAIT_S, max(MAX_POLL_WAIT_S, FAR_SHARE * window.earliest_s))
        if to_earliest > far_cap:
            wait = min(far_cap * jitter_factor(lambda: r), to_earliest)
        else:
            # Land on the earliest end, spread over one dense step before it.
            wait = to_earliest - DENSE_POLL_WAIT_S * r
    elif elapsed <= window.latest_s:
        wait = DENSE_POLL_WAIT_S * jitter_factor(lambda: r)
    else:
        overdue = elapsed - window.latest_s
        wait = min(MAX_POLL_WAIT_S, max(DENSE_POLL_WAIT_S, OVERDUE_SHARE * overdue))
        wait *= jitter_factor(lambda: r)
    return max(MIN_POLL_WAIT_S, wait)
