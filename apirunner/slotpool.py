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

A slot is given back only with its connection idle or closed; otherwise a
new slot takes its place and the old one is closed in the background.
httpcore can leave a connection behind that no later request may use and
its pool never reaps: a cancel while the pool hands a request a new
connection leaves it half made (encode/httpcore#1093, open upstream), and
a second cancel while a cancelled answer is being closed leaves it active
(the first cancel's clean-up is cut; the close that follows finds it
closed already). In a pool of one such a connection blocks the slot for
good: every later request on it waited its whole pool timeout (an
operator's cancel of a job, then its provider's next calls hung).
"""

from __future__ import annotations

import asyncio
import functools
import ssl
from collections.abc import AsyncIterator, Callable

import httpx

from apirunner.wire import head_holding_transport, slot_pool


class SlotTransport(httpx.AsyncBaseTransport):
    """`slots` transports of one connection each; a request uses a free one."""

    def __init__(self, ssl_context: ssl.SSLContext, slots: int) -> None:
        if slots < 1:
            raise ValueError(f"a provider needs at least one connection, not {slots}")
        self._ssl_context = ssl_context
        self._slots = {self._new_slot() for _ in range(slots)}
        self._free: asyncio.LifoQueue[httpx.AsyncHTTPTransport] = asyncio.LifoQueue()
        for slot in self._slots:
            self._free.put_nowait(slot)
        self._closing: set[asyncio.Task[None]] = set()
        self.replaced = 0  # slots given back new: their connection was left unusable

    def _new_slot(self) -> httpx.AsyncHTTPTransport:
        one = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        return head_holding_transport(self._ssl_context, one)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        slot = await self._take(request)
        try:
            response = await slot.handle_async_request(request)
        except BaseException:
            self._give_back(slot)
            raise
        assert isinstance(response.stream, httpx.AsyncByteStream)
        return httpx.Response(
            response.status_code,
            headers=response.headers,
            stream=_Releasing(response.stream, functools.partial(self._give_back, slot)),
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

    def _give_back(self, slot: httpx.AsyncHTTPTransport) -> None:
        if not _usable(slot):
            self._slots.discard(slot)
            closing = asyncio.ensure_future(slot.aclose())
            self._closing.add(closing)
            closing.add_done_callback(self._closed)
            slot = self._new_slot()
            self._slots.add(slot)
            self.replaced += 1
        self._free.put_nowait(slot)

    def _closed(self, closing: asyncio.Task[None]) -> None:
        self._closing.discard(closing)
        if not closing.cancelled():
            closing.exception()  # retrieved: a failed close of a dropped slot is moot

    async def aclose(self) -> None:
        for slot in list(self._slots):
            await slot.aclose()
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)


def _usable(slot: httpx.AsyncHTTPTransport) -> bool:
    """No request of the slot's pool left open, its connection idle or closed."""
    pool = slot_pool(slot)
    return all(c.is_idle() or c.is_closed() for c in pool.connections)


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
