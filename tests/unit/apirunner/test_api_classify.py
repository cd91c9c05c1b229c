"""Classification happens once: retryable or permanent, with a kind."""

from __future__ import annotations

from dataclasses import replace

import httpx
import pytest

from apirunner.classify import (
    MAX_ERRORS_IN_PLACE,
    MAX_RATE_LIMITS_IN_PLACE,
    Failure,
    classify_exception,
    classify_remote_failure,
    classify_status,
    decide_retry,
    error_message,
)
from dispatcher.errors import PermanentError, TransientError


def middle() -> float:
    return 0.5


@pytest.mark.parametrize(
    ("status", "retryable", "kind"),
    [
        (408, True, "http_408"),
        (425, True, "http_425"),
        (429, True, "http_429"),
        (500, True, "http_500"),
        (502, True, "http_502"),
        (503, True, "http_503"),
        (504, True, "http_504"),
        (400, False, "http_400"),
        (401, False, "http_401"),
        (403, False, "http_403"),
        (404, False, "http_404"),
        (409, False, "http_409"),
        (422, False, "http_422"),
    ],
)
def test_status_table(status: int, retryable: bool, kind: str) -> None:
    failure = classify_status(status, '{"error": {"message": "nope"}}')
    assert (failure.retryable, failure.kind, failure.status) == (retryable, kind, status)
    assert "nope" in failure.message


def test_content_refusal_is_permanent_with_its_own_kind() -> None:
    body = '{"error": {"message": "prompt refused", "code": "content_policy_violation"}}'
    failure = classify_status(400, body)
    assert not failure.retryable and failure.kind == "refused"
    assert "content_policy_violation" in failure.message


def test_a_5xx_stays_retryable_whatever_its_text_says() -> None:
    assert classify_status(503, "blocked by upstream safety proxy").retryable


def test_retry_after_travels_with_the_failure() -> None:
    failure = classify_status(429, "", retry_after_s=1.5)
    assert failure.rate_limited and failure.retry_after_s == 1.5


REQUEST = httpx.Request("GET", "http://127.0.0.1:1/x")


@pytest.mark.parametrize(
    ("exc", "retryable", "kind"),
    [
        (httpx.ConnectError("refused", request=REQUEST), True, "connect"),
        (httpx.ConnectTimeout("slow", request=REQUEST), True, "connect"),
        (httpx.ReadTimeout("slow", request=REQUEST), True, "timeout"),
        (httpx.PoolTimeout("busy", request=REQUEST), True, "timeout"),
        (httpx.RemoteProtocolError("peer closed", request=REQUEST), True, "dropped"),
        (httpx.ReadError("reset", request=REQUEST), True, "dropped"),
        (httpx.WriteError("broken pipe", request=REQUEST), True, "dropped"),
        (httpx.UnsupportedProtocol("ftp", request=REQUEST), False, "bad_url"),
        (httpx.LocalProtocolError("bad header", request=REQUEST), False, "protocol"),
        (ValueError("strange"), False, "error"),
    ],
)
def test_exception_table(exc: Exception, retryable: bool, kind: str) -> None:
    failure = classify_exception(exc)
    assert (failure.retryable, failure.kind) == (retryable, kind)


@pytest.mark.parametrize(
    ("reason", "retryable"),
    [
        ("moderation_blocked: the prompt was refused by the safety system", False),
        ("Invalid parameter: seconds must be 4, 8 or 12", False),
        ("content policy violation", False),
        ("internal_error: the worker crashed, please try again", True),
        ("GPU node timed out", True),
        (None, True),
        ("", True),
    ],
)
def test_remote_failure_reasons(reason: str | None, retryable: bool) -> None:
    failure = classify_remote_failure(reason)
    assert failure.retryable is retryable
    assert failure.kind == "remote_failed"


def test_failures_become_the_dispatcher_error_tree() -> None:
    transient = Failure(True, "http_503", "HTTP 503").to_error()
    permanent = Failure(False, "http_400", "HTTP 400").to_error()
    assert isinstance(transient, TransientError) and transient.kind == "http_503"
    assert isinstance(permanent, PermanentError) and permanent.kind == "http_400"
    assert transient.retryable and not permanent.retryable


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ('{"error": {"message": "bad", "code": "x"}}', "x: bad"),
        ('{"error": {"message": "bad"}}', "bad"),
        ('{"detail": "still running"}', "still running"),
        ('{"error": "flat"}', "flat"),
        ("<html>gateway</html>", "<html>gateway</html>"),
        ("", ""),
    ],
)
def test_error_message_shapes(body: str, expected: str) -> None:
    assert error_message(body) == expected


def test_retry_decisions() -> None:
    server = Failure(True, "http_503", "x", 503)
    assert decide_retry(Failure(False, "http_400", "x", 400), 0, 0, middle).retry is False
    first = decide_retry(server, 0, 0, middle)
    assert first.retry and first.wait_s == pytest.approx(1.0)
    assert decide_retry(server, 1, 0, middle).wait_s == pytest.approx(2.0)
    assert decide_retry(server, MAX_ERRORS_IN_PLACE - 1, 0, middle).retry is False
    # With a Retry-After the gate waits; the decision adds nothing on top.
    assert decide_retry(replace(server, retry_after_s=3.0), 0, 0, middle).wait_s == 0.0


def test_rate_limits_have_their_own_budget() -> None:
    limited = Failure(True, "http_429", "x", 429, retry_after_s=0.5)
    decision = decide_retry(limited, MAX_ERRORS_IN_PLACE, 10, middle)
    assert decision.retry and decision.rate_limited and decision.wait_s == 0.0
    assert decide_retry(limited, 0, MAX_RATE_LIMITS_IN_PLACE - 1, middle).retry is False
    without_header = Failure(True, "http_429", "x", 429)
    assert decide_retry(without_header, 0, 2, middle).wait_s == pytest.approx(4.0)
