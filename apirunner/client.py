"""One pooled HTTP client per provider, and the only way requests leave.

Every request passes, in order: the outbound allowlist (refused before a
connection is opened), the provider's Retry-After gate, the send, and the
translation of whatever went wrong into a classified `Failure` (raised as
`CallFailed`). A Retry-After on a 429/503 pushes the gate for the whole lane.
In-place retries (`with_retries`) sit on top, decided by `decide_retry`.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import mimetypes
import os
import re
import ssl
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from email.message import Message
from pathlib import Path
from typing import Any, TypeVar

import httpx

from apirunner.allowlist import Allowlist
from apirunner.classify import (
    Failure,
    bad_answer,
    classify_exception,
    classify_status,
    decide_retry,
)
from apirunner.gate import RetryGate, race_cancel, sleep_nominal
from apirunner.polling import Rand, parse_retry_after
from dispatcher.clock import Clock
from dispatcher.runner import ResultFile

T = TypeVar("T")

_CHUNK = 64 * 1024
_MAX_ERROR_BODY = 64 * 1024
_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")


class CallFailed(Exception):
    """One request failed; `failure` says how (classified exactly once).

    `body`: what the provider answered, when it answered (kept as evidence).
    """

    def __init__(self, failure: Failure, body: str | None = None) -> None:
        super().__init__(failure.message)
        self.failure = failure
        self.body = body


@dataclass(frozen=True)
class Call:
    method: str
    url: str
    headers: Mapping[str, str] = field(default_factory=dict)
    json: Any = None
    read_timeout_s: float | None = None  # None: the client's default
    # A multipart upload instead of JSON: {"field": (filename, bytes, type)}
    # plus plain form fields (ComfyUI's /upload/image).
    files: Mapping[str, tuple[str, bytes, str]] | None = None
    form: Mapping[str, str] | None = None


@dataclass(frozen=True)
class Answer:
    data: Any
    status: int
    http_version: str


def build_http_client(
    concurrency: int,
    timeout_s: float,
    allowlist: Allowlist,
    ssl_context: ssl.SSLContext,
    gate: RetryGate,
) -> httpx.AsyncClient:
    """The provider's pooled client: at most `concurrency` connections.

    The pool limit equals the lane's concurrency, so even a bug elsewhere
    cannot open more connections than the provider's quota allows.
    """

    async def last_check(request: httpx.Request) -> None:
        # Runs for every request, redirect hops included, just before a
        # connection is chosen. The checks in `ProviderClient` ran first;
        # repeating them here covers redirects, and a Retry-After another
        # task received in the instant since this one passed the gate.
        allowlist.check(request.url)
        await gate.wait(None)

    client = httpx.AsyncClient(
        http2=True,
        verify=ssl_context,
        limits=httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency),
        timeout=httpx.Timeout(timeout_s),
        follow_redirects=True,
        event_hooks={"request": [last_check]},
    )
    # httpx offers no way to pass its own Cookies subclass; the setter copies.
    client._cookies = _ProviderCookies()
    return client


class _ProviderCookies(httpx.Cookies):
    """The client's cookie jar; answers that set no cookie skip it.

    httpx hands every response to the jar, which first rebuilds it as a urllib
    request (parsing the URL once more): a good share of a request's CPU for
    provider APIs, which authenticate with headers and set no cookies. The
    jar's default policy reads only Set-Cookie (Set-Cookie2 is off), so
    skipping answers without one changes nothing it would have stored.
    """

    def extract_cookies(self, response: httpx.Response) -> None:
        if "set-cookie" in response.headers:
            super().extract_cookies(response)


@functools.lru_cache(maxsize=256)
def _parsed_url(url: str) -> httpx.URL:
    """A request URL parsed once: the same endpoints and status URLs repeat, and
    httpx would otherwise parse the string again for every request."""
    return httpx.URL(url)


def _timeout(default: httpx.Timeout, read_s: float | None) -> httpx.Timeout:
    if read_s is None:
        return default
    return httpx.Timeout(
        connect=default.connect, read=read_s, write=default.write, pool=default.pool
    )


def result_file_name(
    url: str, content_disposition: str | None, content_type: str, stem: str
) -> str:
    """A safe file name: the server's, else the URL's last segment, else stem+ext."""
    name = ""
    if content_disposition:
        msg = Message()
        msg["content-disposition"] = content_disposition
        name = msg.get_filename() or ""
    if not name:
        last = httpx.URL(url).path.rstrip("/").rsplit("/", 1)[-1]
        name = last if "." in last else ""
    name = _SAFE_NAME.sub("_", os.path.basename(name)).strip("._")
    if not name:
        ext = mimetypes.guess_extension(content_type.split(";")[0].strip()) or ".bin"
        name = f"{stem}{ext}"
    return name


class ProviderClient:
    """The lane's connection pool, gate and allowlist, behind two calls."""

    def __init__(
        self,
        provider: str,
        http: httpx.AsyncClient,
        allowlist: Allowlist,
        gate: RetryGate,
        clock: Clock,
        log: logging.Logger,
    ) -> None:
        self.provider = provider
        self.gate = gate
        # Answers by HTTP status ("error" when none came), for the metrics.
        self.requests: Counter[str] = Counter()
        self._http = http
        http.event_hooks["response"] = [*http.event_hooks.get("response", []), self._count]
        self._allowlist = allowlist
        self._clock = clock
        self._log = log

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _count(self, response: httpx.Response) -> None:
        self.requests[str(response.status_code)] += 1

    async def _before_send(self, url: str, cancel: asyncio.Event | None) -> None:
        self._allowlist.check(url)
        waited = await self.gate.wait(cancel)
        if waited >= 0.001:  # the gate reports microseconds even when it was open
            self._log.info(
                "[api:%s] waited %.3f s for the provider's Retry-After", self.provider, waited
            )

    def _failed(self, response: httpx.Response, body: str) -> CallFailed:
        retry_after = parse_retry_after(response.headers, self._clock.now())
        failure = classify_status(response.status_code, body, retry_after)
        if retry_after is not None and failure.retryable:
            self.gate.defer(retry_after)
        return CallFailed(failure, body[:_MAX_ERROR_BODY])

    async def json(self, call: Call, cancel: asyncio.Event | None) -> Answer:
        """Send one request and decode its JSON answer."""
        await self._before_send(call.url, cancel)
        try:
            response = await race_cancel(
                self._http.request(
                    call.method,
                    _parsed_url(call.url),
                    headers=dict(call.headers),
                    json=call.json,
                    files=call.files,
                    data=call.form,
                    timeout=_timeout(self._http.timeout, call.read_timeout_s),
                ),
                cancel,
            )
        except httpx.HTTPError as exc:
            self.requests["error"] += 1
            raise CallFailed(classify_exception(exc)) from exc
        if response.status_code >= 300:
            raise self._failed(response, response.text)
        if not response.content:
            return Answer(None, response.status_code, response.http_version)
        try:
            data = response.json()
        except ValueError as exc:
            raise CallFailed(
                bad_answer(f"HTTP {response.status_code} answer is not JSON", retryable=True)
            ) from exc
        return Answer(data, response.status_code, response.http_version)

    async def download(
        self, call: Call, dest_dir: Path, stem: str, cancel: asyncio.Event | None
    ) -> ResultFile:
        """Stream the answer to a file, hashing as it goes; nothing is held in memory."""
        await self._before_send(call.url, cancel)
        try:
            return await race_cancel(self._stream(call, dest_dir, stem), cancel)
        except httpx.HTTPError as exc:
            self.requests["error"] += 1
            raise CallFailed(classify_exception(exc)) from exc

    async def _stream(self, call: Call, dest_dir: Path, stem: str) -> ResultFile:
        async with self._http.stream(
            call.method,
            _parsed_url(call.url),
            headers=dict(call.headers),
            timeout=_timeout(self._http.timeout, call.read_timeout_s),
        ) as response:
            if response.status_code >= 300:
                body = (await response.aread()).decode("utf-8", "replace")
                raise self._failed(response, body)
            content_type = response.headers.get("content-type", "application/octet-stream")
            name = result_file_name(
                call.url, response.headers.get("content-disposition"), content_type, stem
            )
            await asyncio.to_thread(dest_dir.mkdir, parents=True, exist_ok=True)
            final = dest_dir / name
            partial = dest_dir / f".{name}.part"
            digest = hashlib.sha256()
            size = 0
            try:
                # Writes are synchronous on purpose: a 64 KiB chunk to local disk
                # takes microseconds, less than a thread hop would.
                with partial.open("wb") as out:
                    async for chunk in response.aiter_bytes(_CHUNK):
                        out.write(chunk)
                        digest.update(chunk)
                        size += len(chunk)
                expected = response.headers.get("content-length")
                if expected is not None and expected.isdigit() and int(expected) != size:
                    raise CallFailed(
                        Failure(True, "dropped", f"download ended at {size} of {expected} bytes")
                    )
                partial.replace(final)
            except BaseException:
                partial.unlink(missing_ok=True)
                raise
        return ResultFile(
            path=str(final.resolve()),
            name=name,
            size=size,
            content_type=content_type.split(";")[0].strip(),
            sha256=digest.hexdigest(),
        )


async def with_retries(
    op: Callable[[], Awaitable[T]],
    *,
    clock: Clock,
    rand: Rand,
    cancel: asyncio.Event | None,
    on_retry: Callable[[Failure, int], None] | None = None,
) -> T:
    """Run `op` until it succeeds or `decide_retry` gives up (then re-raise).

    For requests that are safe to repeat: submits carry the same
    Idempotency-Key each time, downloads and reads change nothing remotely.
    """
    errors = 0
    rate_limits = 0
    while True:
        try:
            return await op()
        except CallFailed as exc:
            decision = decide_retry(exc.failure, errors, rate_limits, rand)
            if not decision.retry:
                raise
            if decision.rate_limited:
                rate_limits += 1
            else:
                errors += 1
            if on_retry is not None:
                on_retry(exc.failure, errors + rate_limits)
            await sleep_nominal(clock, decision.wait_s, cancel)
