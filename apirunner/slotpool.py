"""A provider's connections, one per slot of its concurrency (issue 31).

A lane runs at most `concurrency` requests at once, so its client needs at
most that many connections. httpcore's pool, shared by all of them, hands a
freed connection to every request queued at that instant: the first to
start takes it, the others are told "not available" and queue again, each
round scanning every connection of the pool. On the batch benchmark that was
~0.6 retries a request, ~13 % of the provider call's CPU.

Here each slot is httpx's own transport (`wire.head_holding_transport`),
limited to one connection, and a request takes a free one for as long as its
answer is open: no two requests ever wait for the same connection, and a
connection is kept warm by the slot that used it last (the last freed is the
next taken). Everything else is httpx's and httpcore's as before: HTTP/1.1
and HTTP/2, TLS, keep-alive, their timeouts and errors; the `pool` timeout
bounds the wait for a free slot (`httpx.PoolTimeout`, as from their pool).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Callable

import httpx

from apirunner.wire import head_holding_transport


class SlotTransport(httpx.AsyncBaseTransport):
    """`slots` transports of one connection each; a request uses a free one."""

    def __init__(self, ssl_context: ssl.SSLContext, slots: int) -> None:
        if slots < 1:
            raise ValueError(f"a provider needs at least one connection, not {slots}")
        one = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        self._slots = [head_holding_transport(ssl_context, one) for _ in range(slots)]
        self._free: asyncio.LifoQueue[httpx.AsyncHTTPTransport] = asyncio.LifoQueue()
        for slot in self._slots:
            self._free.put_nowait(slot)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        slot = await self._take(request)
        try:
            response = await slot.handle_async_request(request)
        except BaseException:
            self._free.put_nowait(slot)
            raise
        assert isinstance(response.stream, httpx.AsyncByteStream)
        return httpx.Response(
            response.status_code,
            headers=response.headers,
            stream=_Releasing(response.stream, lambda: self._free.put_nowait(slot)),
            extensions=response.extensions,
        )

    async def _take(self, request: httpx.Request) -> httpx.AsyncHTTPTransport:
        if not self._free.empty():
            return self._free.get_nowait()
        timeouts = request.extensions.get("timeout", {})
        wait_s = timeouts.get("pool")
        try:
            async with asyncio.timeout(wait_s):
                return await self._free.get()
        except TimeoutError as exc:
            raise httpx.PoolTimeout(
                f"no free connection within {wait_s:g} s", request=request
            ) from exc

    async def aclose(self) -> None:
        for slot in self._slots:
            await slot.aclose()


class _Releasing(httpx.AsyncByteStream):
    """An answer's body; its slot is free again once it is closed."""

    def __init__(self, inner: httpx.AsyncByteStream, release: Callable[[], None]) -> None:
        self._inner = inner
        self._release: Callable[[], None] | None = release

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._inner.__aiter__()  # no generator of our own per chunk

    async def aclose(self) -> None:
        try:
            await self._inner.aclose()
        finally:
            release, self._release = self._release, None
            if release is not None:
                release()
