"""One pooled HTTP client per provider, and the only way requests leave.

Every request passes, in order: the outbound allowlist (refused before a
connection is opened), the provider's Retry-After gate, the send through
`dispatcher.fetch` (redirects hop by hop, the API key only on the profile's
own origin, answers bounded in size and time), and the translation of
whatever went wrong into a classified `Failure` (raised as `CallFailed`).
A Retry-After on a 429/503 pushes the gate for the whole lane. In-place
retries (`with_retries`) sit on top, decided by `decide_retry`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import ssl
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import httpx

from apirunner.auth import KeyRing
from apirunner.classify import (
    Failure,
    answer_error,
    bad_answer,
    classify_exception,
    classify_status,
    decide_retry,
)
from apirunner.gate import RetryGate
from apirunner.polling import Rand, parse_retry_after
from apirunner.ratelimits import limit_wait
from apirunner.slotpool import SlotTransport
from dispatcher import fetch
from dispatcher.accounts.health import Throttle, after_call
from dispatcher.allowlist import Allowlist
from dispatcher.clock import Clock
from dispatcher.errors import TransientError
from dispatcher.fetch import Origin, OriginJars, result_file_name
from dispatcher.models import Task
from dispatcher.profile_extras import ErrorWords, RateLimitSpec
from dispatcher.profiles import ApiSpec
from dispatcher.scheduling.protocol import ResultFile, RunContext

__all__ = [
    "Answer",
    "Call",
    "CallFailed",
    "ProviderClient",
    "build_http_client",
    "result_file_name",
    "with_retries",
]

_MAX_ERROR_BODY = 64 * 1024
T = TypeVar("T")


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
    # Sent only to `credentials_origin` (the profile's own host): a redirect
    # elsewhere, even to another allowlisted host, goes without them.
    credentials: Mapping[str, str] = field(default_factory=dict)
    credentials_origin: Origin | None = None
    # Real seconds for the whole request (every hop, the whole body); None: unbounded.
    deadline_s: float | None = None
    deadline_label: str = "its deadline"
    # The profile's words for its failures and its rate-limit headers.
    errors: ErrorWords = field(default_factory=ErrorWords)
    rate_limit: RateLimitSpec | None = None


def profile_call(
    api: ApiSpec,
    clock: Clock,
    method: str,
    url: str,
    body: Any = None,
    *,
    files: Mapping[str, tuple[str, bytes, str]] | None = None,
    form: Mapping[str, str] | None = None,
    read_timeout_s: float | None = None,
    deadline: bool = True,
) -> Call:
    """A request to the server a profile names (a ComfyUI server, a gradio
    app), through the one fetch path: its key (`auth_env`) goes only to the
    profile's own origin, never across a redirect; bounded by the profile's
    `timeout_s` unless `deadline` is off (a stream the caller bounds)."""
    token = os.environ.get(api.auth_env) if api.auth_env else None
    credentials = {api.auth_header: f"{api.auth_prefix}{token}"} if token else {}
    return Call(
        method,
        url,
        {"Accept": "application/json"},
        body,
        files=files,
        form=form,
        read_timeout_s=read_timeout_s,
        credentials=credentials,
        credentials_origin=fetch.origin_of(api.base_url),
        deadline_s=clock.scaled(api.timeout_s) if deadline else None,
        deadline_label=f"the profile's timeout_s ({api.timeout_s:g} s)",
    )


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
    transport: httpx.AsyncBaseTransport | None = None,
) -> httpx.AsyncClient:
    """The provider's pooled client: at most `concurrency` connections.

    The pool limit equals the lane's concurrency, so even a bug elsewhere
    cannot open more connections than the provider's quota allows. A
    `transport` (tests: `httpx.MockTransport`) replaces the network, and
    with it the pool; every check above the transport stays.
    """

    async def last_check(request: httpx.Request) -> None:
        # Runs for every request, redirect hops included, just before a
        # connection is chosen. `ProviderClient` and the hop loop in
        # `dispatcher.fetch` checked first; this is the last line, and it
        # catches a Retry-After another task received in the instant since
        # this one passed the gate.
        allowlist.check(request.url)
        await gate.wait()

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    client = httpx.AsyncClient(
        http2=True,
        verify=ssl_context,
        limits=limits,
        timeout=httpx.Timeout(timeout_s),
        # Redirects are followed hop by hop in `dispatcher.fetch`, which drops
        # credentials off their origin; cookies live there too, per origin.
        follow_redirects=False,
        event_hooks={"request": [last_check]},
        # One connection per slot of the lane (`apirunner.slotpool`), a
        # request's head and body in one send (`apirunner.wire`).
        transport=transport or SlotTransport(ssl_context, concurrency),
    )
    return fetch.without_cookie_jar(client)


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
        *,
        max_json_bytes: int = 16 * 1024**2,
        quota: int = 1,
    ) -> None:
        self.provider = provider
        self.gate = gate
        self.quota = quota
        # The lane's concurrency under 429 storms without Retry-After; the
        # scheduler starts no more than `throttle.effective` tasks at a time.
        self.throttle = Throttle(effective=quota)
        # Answers by HTTP status ("error" when none came), for the metrics.
        self.requests: Counter[str] = Counter()
        self._http = http
        http.event_hooks["response"] = [*http.event_hooks.get("response", []), self._count]
        self._allowlist = allowlist
        self._clock = clock
        self._log = log
        self._max_json_bytes = max_json_bytes
        self._jars = OriginJars()
        self.keys = KeyRing()  # the lane's key, or its signed JWT kept until near expiry

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _count(self, response: httpx.Response) -> None:
        self.requests[str(response.status_code)] += 1
        status = response.status_code
        if status == 429 and parse_retry_after(response.headers, self._clock.now()) is None:
            # No instruction from the provider: too many of us at once.
            self._adapt(throttled=True)
        elif 200 <= status < 300:
            self._adapt(throttled=False)

    def _adapt(self, *, throttled: bool) -> None:
        before = self.throttle.effective
        self.throttle = after_call(self.throttle, self.quota, throttled=throttled)
        if self.throttle.effective != before:
            self._log.warning(
                "[api:%s] effective concurrency %d -> %d (quota %d)%s",
                self.provider,
                before,
                self.throttle.effective,
                self.quota,
                ": 429s without Retry-After" if throttled else ": successes in a row",
                extra={"lane": f"api:{self.provider}"},
            )

    async def _before_send(self, url: str) -> None:
        self._allowlist.check(url)
        waited = await self.gate.wait()
        if waited >= 0.001:  # the gate reports microseconds even when it was open
            self._log.info(
                "[api:%s] waited %.3f s for the provider's Retry-After",
                self.provider,
                waited,
                extra={"lane": f"api:{self.provider}"},
            )

    def _failed(self, response: httpx.Response, body: str, call: Call) -> CallFailed:
        now = self._clock.now()
        retry_after = parse_retry_after(response.headers, now)
        if retry_after is None and response.status_code == 429:
            # No Retry-After: the profile's reset header says when it lifts.
            retry_after = limit_wait(call.rate_limit, response.headers, now, refused=True)
        failure = classify_status(response.status_code, body, retry_after, call.errors)
        if failure.kind in ("http_401", "http_403") and (
            fetch.origin_of(response.request.url) != call.credentials_origin
        ):
            # A host that never saw the key (a CDN's signed URL, expired) says
            # nothing about the key: not a reason to hold the provider's lane.
            failure = replace(
                failure,
                kind="url_refused",
                message=f"{failure.message} (from {response.request.url.host}, "
                "which the key is never sent to: an expired or foreign URL)",
            )
        if retry_after is not None and failure.retryable:
            self.gate.defer(retry_after)
        return CallFailed(failure, body[:_MAX_ERROR_BODY])

    def _note_limits(self, response: httpx.Response, call: Call) -> None:
        """A success that used the last request of the window holds the lane until it resets."""
        wait = limit_wait(call.rate_limit, response.headers, self._clock.now(), refused=False)
        if wait is not None and wait > 0:
            self.gate.defer(wait)

    def _outbound(self, call: Call) -> fetch.Outbound:
        return fetch.Outbound(
            method=call.method,
            url=_parsed_url(call.url),
            headers=call.headers,
            credentials=call.credentials,
            credentials_origin=call.credentials_origin,
            json=call.json,
            files=call.files,
            form=call.form,
            timeout=_timeout(self._http.timeout, call.read_timeout_s),
        )

    async def _translated(self, work: Awaitable[T]) -> T:
        """Translate what the network did into a `CallFailed` (permanent errors pass)."""
        try:
            return await work
        except httpx.HTTPError as exc:
            self.requests["error"] += 1
            raise CallFailed(classify_exception(exc)) from exc
        except TransientError as exc:  # a truncated body: worth the same request again
            raise CallFailed(Failure(True, exc.kind, exc.message)) from exc

    async def json(self, call: Call) -> Answer:
        """Send one request and decode its JSON answer (bounded in size and depth).

        Like every wait here, it stops on a cancel only when awaited through
        `RunContext.guard`.
        """
        await self._before_send(call.url)
        return await self._translated(self._json(call))

    async def _json(self, call: Call) -> Answer:
        what = f"the answer of {call.method} {call.url}"
        async with (
            fetch.deadline(call.deadline_s, what, call.deadline_label),
            fetch.open_stream(
                self._http, self._allowlist, self._outbound(call), jars=self._jars
            ) as response,
        ):
            if response.status_code >= 300:
                raise self._failed(response, await fetch.read_error_text(response), call)
            self._note_limits(response, call)
            body = await fetch.read_capped(response, self._max_json_bytes, what)
        if not body:
            return Answer(None, response.status_code, response.http_version)
        try:
            data = fetch.decode_json(body)
        except fetch.BadJson as exc:
            raise CallFailed(
                bad_answer(f"HTTP {response.status_code} answer: {exc}", retryable=True)
            ) from exc
        failure = answer_error(call.errors, data)
        if failure is not None:  # an error sent with HTTP 200
            raise CallFailed(failure, body[:_MAX_ERROR_BODY].decode("utf-8", "replace"))
        return Answer(data, response.status_code, response.http_version)

    @contextlib.asynccontextmanager
    async def stream(self, call: Call) -> AsyncIterator[httpx.Response]:
        """An answer read as it arrives (an event stream), through the one
        fetch path; network errors while reading it become `CallFailed` too.
        No deadline: the caller bounds the whole wait."""
        await self._before_send(call.url)
        try:
            async with fetch.open_stream(
                self._http, self._allowlist, self._outbound(call), jars=self._jars
            ) as response:
                if response.status_code >= 300:
                    raise self._failed(response, await fetch.read_error_text(response), call)
                yield response
        except httpx.HTTPError as exc:
            self.requests["error"] += 1
            raise CallFailed(classify_exception(exc)) from exc

    async def download(
        self,
        call: Call,
        dest_dir: Path,
        stem: str,
        *,
        max_bytes: int,
    ) -> ResultFile:
        """Stream the answer to a file, hashing as it goes; nothing is held in memory."""
        await self._before_send(call.url)
        return await self._translated(self._download(call, dest_dir, stem, max_bytes))

    async def _download(self, call: Call, dest_dir: Path, stem: str, max_bytes: int) -> ResultFile:
        async with (
            fetch.deadline(call.deadline_s, f"downloading {call.url}", call.deadline_label),
            fetch.open_stream(
                self._http, self._allowlist, self._outbound(call), jars=self._jars
            ) as response,
        ):
            if response.status_code >= 300:
                raise self._failed(response, await fetch.read_error_text(response), call)
            self._note_limits(response, call)
            return await fetch.save_stream(response, dest_dir, stem=stem, max_bytes=max_bytes)


async def with_retries(
    op: Callable[[], Awaitable[T]],
    *,
    clock: Clock,
    rand: Rand,
    on_retry: Callable[[Failure, int], None] | None = None,
) -> T:
    """Run `op` until it succeeds or `decide_retry` gives up (then re-raise).

    For requests that are safe to repeat: submits carry the same
    Idempotency-Key each time, downloads and reads change nothing remotely.
    Awaited through `RunContext.guard`, a cancel ends the request or the
    wait between two tries.
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
            await clock.sleep(decision.wait_s)


@dataclass(frozen=True)
class AttemptScope:
    """What every API attempt works with: the task and its run context, the
    provider's spec and pooled client, the clock and the jitter source."""

    task: Task
    ctx: RunContext
    api: ApiSpec
    client: ProviderClient
    clock: Clock
    rand: Rand
    http_timeout_s: float


class AttemptBase:
    """An attempt's shared fields, flat, as its methods read them."""

    def __init__(self, scope: AttemptScope) -> None:
        self.scope = scope
        self.task, self.ctx, self.api = scope.task, scope.ctx, scope.api
        self.client, self.clock, self.rand = scope.client, scope.clock, scope.rand
        self.http_timeout_s = scope.http_timeout_s
