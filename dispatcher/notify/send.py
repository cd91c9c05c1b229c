"""One webhook POST, bounded: a total deadline, and a few KB of answer at most.

A receiver is the operator's, but it may be broken or slow: one that drips
a header line every few seconds never trips a per-read timeout, and one that
answers with an endless body would be read for ever. So every attempt has
one deadline for the whole exchange (connect, send, headers, answer), and
of the answer only the status and its first `MAX_ANSWER_BYTES` are read
(then the connection is closed, not drained).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
from dataclasses import dataclass

import httpx

MAX_ANSWER_BYTES = 4096
# Statuses worth another try; any other 4xx (and a redirect) will not change.
RETRY_STATUSES = frozenset({408, 425, 429})


def sign(secret: str, body: bytes) -> str:
    """The signature header's value for a raw body."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def display_url(url: str) -> str:
    """The URL without user info or query, which may carry the receiver's secrets."""
    parsed = httpx.URL(url)
    port = f":{parsed.port}" if parsed.port else ""
    return f"{parsed.scheme}://{parsed.host}{port}{parsed.path}"


@dataclass(frozen=True)
class Answer:
    status: int | None
    error: str | None
    answer_bytes: int = 0

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300

    @property
    def retryable(self) -> bool:
        return self.status is None or self.status >= 500 or self.status in RETRY_STATUSES


async def post_once(
    http: httpx.AsyncClient,
    url: str,
    body: bytes,
    headers: dict[str, str],
    deadline_s: float,
) -> Answer:
    """POST the body; the status, or why there is none, within `deadline_s`."""
    shown = display_url(url)
    status: int | None = None
    read = 0
    try:
        async with asyncio.timeout(deadline_s):
            async with http.stream("POST", url, content=body, headers=headers) as response:
                status = response.status_code
                # A little of the answer lets a small one finish and its
                # connection be reused; the rest is never read.
                async for chunk in response.aiter_raw():
                    read += len(chunk)
                    if read >= MAX_ANSWER_BYTES:
                        break
                return Answer(status, None, min(read, MAX_ANSWER_BYTES))
    except TimeoutError:
        if status is not None:  # the status came in time; a slow body does not matter
            return Answer(status, None, min(read, MAX_ANSWER_BYTES))
        return Answer(None, f"no complete answer within the {deadline_s:g}s deadline", read)
    except httpx.HTTPError as exc:
        return Answer(None, f"{type(exc).__name__}: {exc}".replace(url, shown)[:300], read)
