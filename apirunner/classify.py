"""Every failure is classified once, here: retryable or permanent, with a kind.

Pure functions that return a `Failure`; the runner turns it into the error
tree of `dispatcher.errors` at the edge (`Failure.to_error`). Whether to try
again *inside* the attempt is a second pure decision, `decide_retry`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import httpx

from apirunner.polling import Rand, retry_wait
from apirunner.templates import MISSING, lookup
from dispatcher.errors import PermanentError, RunError, TransientError
from dispatcher.profile_extras import ErrorWords

NO_WORDS = ErrorWords()

# 408 timeout, 425 too early, 429 rate limited: the same request later may work.
RETRYABLE_STATUSES = frozenset({408, 425, 429})

# Words a provider uses when it refused the content itself: retrying an
# identical prompt earns the same refusal, so these are permanent even when
# the HTTP status or the remote job's state would not say so.
_REFUSAL_WORDS = (
    "content_policy",
    "content policy",
    "moderation",
    "safety",
    "refus",
    "policy_violation",
    "blocked",
    "not allowed",
    "nsfw",
)
# Words of a failure that said nothing about the input: worth another attempt.
_INPUT_WORDS = ("invalid", "validation", "unsupported", "malformed", "bad request")

_MAX_MESSAGE = 300
_MAX_SCAN = 64 * 1024  # how much of an error body the profile's words are looked for in


@dataclass(frozen=True)
class Failure:
    retryable: bool
    kind: str
    message: str
    status: int | None = None
    retry_after_s: float | None = None  # real seconds the provider asked for

    @property
    def rate_limited(self) -> bool:
        return self.status == 429

    def to_error(self) -> RunError:
        cls = TransientError if self.retryable else PermanentError
        return cls(self.message, kind=self.kind)


def error_message(body: str) -> str:
    """The human part of an error answer: OpenAI, fal and plain-text shapes."""
    text = body.strip()
    try:
        data = json.loads(text) if text else None
    except ValueError:
        data = None
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            code = err.get("code")
            return f"{code}: {err['message']}" if isinstance(code, str) else err["message"]
        for key in ("error", "detail", "message"):
            if isinstance(data.get(key), str):
                return str(data[key])
    return text[:_MAX_MESSAGE]


def _refused(text: str) -> bool:
    lowered = text.lower()
    return any(word in lowered for word in _REFUSAL_WORDS)


def profile_words(words: ErrorWords, text: str) -> str | None:
    """Which of the profile's classes (`[api.errors]`) `text` falls in, if any.

    Refusal first: a refused prompt is never worth a retry, whatever else
    the answer says."""
    lowered = text.lower()
    for kind in ("refused", "quota", "capacity"):
        if any(word in lowered for word in getattr(words, kind)):
            return kind
    return None


def _by_words(
    words: ErrorWords, text: str, message: str, status: int | None, retry_after_s: float | None
) -> Failure | None:
    kind = profile_words(words, text)
    if kind is None:
        return None
    # Capacity is retried (the vendor is busy); a refusal or a spent quota is not.
    return Failure(kind == "capacity", kind, message, status, retry_after_s)


def classify_status(
    status: int, body: str, retry_after_s: float | None = None, words: ErrorWords = NO_WORDS
) -> Failure:
    """An HTTP answer that was not a success; the profile's words are read first."""
    detail = error_message(body)
    message = f"HTTP {status}" + (f": {detail}" if detail else "")
    # The whole body, not only the message: vendors put the telling code
    # (`moderation_blocked`, `insufficient_quota`) beside the message.
    by_words = _by_words(words, body[:_MAX_SCAN], message, status, retry_after_s)
    if by_words is not None:
        return by_words
    if status in RETRYABLE_STATUSES or 500 <= status <= 599:
        return Failure(True, f"http_{status}", message, status, retry_after_s)
    # 401/403 keep their own kind: the scheduler reads them as a bad key.
    if 400 <= status <= 499 and status not in (401, 403) and _refused(detail):
        return Failure(False, "refused", message, status, retry_after_s)
    return Failure(False, f"http_{status}", message, status, retry_after_s)


def answer_error(words: ErrorWords, data: Any) -> Failure | None:
    """A 2xx answer whose own status code (`[api.errors] code`) says it failed."""
    if words.code is None:
        return None
    code = lookup(data, words.code)
    if code is MISSING or code is None or isinstance(code, dict | list) or str(code) in words.ok:
        return None
    detail = lookup(data, words.message) if words.message else MISSING
    text = f"{code}: {detail}" if isinstance(detail, str) else str(code)
    message = f"the vendor answered error {text}"[:_MAX_MESSAGE]
    by_words = _by_words(words, text, message, None, None)
    return by_words or Failure(False, "vendor_error", message)


def classify_exception(exc: Exception) -> Failure:
    """An httpx error (or a malformed answer) raised before any status arrived."""
    name = type(exc).__name__
    message = f"{name}: {exc}" if str(exc) else name
    if isinstance(exc, httpx.ConnectTimeout | httpx.ConnectError):
        return Failure(True, "connect", message)
    if isinstance(exc, httpx.TimeoutException):
        return Failure(True, "timeout", message)
    if isinstance(exc, httpx.RemoteProtocolError | httpx.ReadError | httpx.WriteError):
        return Failure(True, "dropped", message)
    if isinstance(exc, httpx.CloseError | httpx.NetworkError | httpx.DecodingError):
        return Failure(True, "network", message)
    if isinstance(exc, httpx.UnsupportedProtocol | httpx.InvalidURL):
        return Failure(False, "bad_url", message)
    if isinstance(exc, httpx.TooManyRedirects):
        return Failure(False, "redirects", message)
    if isinstance(exc, httpx.LocalProtocolError):
        return Failure(False, "protocol", message)
    if isinstance(exc, httpx.TransportError):
        return Failure(True, "transport", message)
    return Failure(False, "error", message)


def bad_answer(what: str, *, retryable: bool) -> Failure:
    """A 2xx answer we cannot use: one we cannot read is worth another poll
    (`retryable`; never the same request again in place, see `decide_retry`),
    an answer missing a field the profile names is not."""
    return Failure(retryable, "bad_answer", what)


def classify_remote_failure(reason: str | None, words: ErrorWords = NO_WORDS) -> Failure:
    """A remote job that ended `failed`: the profile's words first; else
    permanent when the reason blames the input (refusal, validation),
    retryable otherwise (worker crash, overload)."""
    text = (reason or "").strip() or "the provider gave no reason"
    message = f"remote job failed: {text}"[: _MAX_MESSAGE + 20]
    kind = profile_words(words, text[:_MAX_SCAN])
    if kind is not None:
        return Failure(kind == "capacity", kind, message)
    lowered = text.lower()
    permanent = _refused(text) or any(word in lowered for word in _INPUT_WORDS)
    return Failure(not permanent, "remote_failed", message)


# In-place retries: how many times one request may fail before the attempt
# gives up. Rate limits are counted apart: a provider that says "later" is
# healthy, and waiting it out is cheaper than burning an attempt.
MAX_ERRORS_IN_PLACE = 5
MAX_RATE_LIMITS_IN_PLACE = 50


@dataclass(frozen=True)
class RetryDecision:
    retry: bool
    wait_s: float = 0.0  # nominal seconds; 0 when the provider's gate does the waiting
    rate_limited: bool = False


def decide_retry(
    failure: Failure,
    errors_so_far: int,
    rate_limits_so_far: int,
    rand: Rand,
    *,
    max_errors: int = MAX_ERRORS_IN_PLACE,
    max_rate_limits: int = MAX_RATE_LIMITS_IN_PLACE,
) -> RetryDecision:
    """Try the same request again inside this attempt, or give up on it?

    `errors_so_far` / `rate_limits_so_far` count earlier failures of this
    request, not including `failure` itself.
    """
    if not failure.retryable or failure.kind == "bad_answer":
        # A 2xx we cannot read was done all the same (a job made, an upload
        # stored): sending it again repeats the work and, likely, the answer.
        return RetryDecision(retry=False)
    if failure.rate_limited:
        if rate_limits_so_far + 1 >= max_rate_limits:
            return RetryDecision(retry=False, rate_limited=True)
        wait = 0.0 if failure.retry_after_s is not None else retry_wait(rate_limits_so_far, rand)
        return RetryDecision(retry=True, wait_s=wait, rate_limited=True)
    if errors_so_far + 1 >= max_errors:
        return RetryDecision(retry=False)
    wait = 0.0 if failure.retry_after_s is not None else retry_wait(errors_so_far, rand)
    return RetryDecision(retry=True, wait_s=wait)
