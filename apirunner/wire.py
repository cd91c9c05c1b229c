"""The provider pool's network streams: one send per request, asyncio's transports.

httpcore writes an HTTP/1.1 request's head (request line and headers) and
its body as two separate sends. With TCP_NODELAY (asyncio sets it) that is
two segments and two wake-ups of the server for every request, and two
system calls here: on the dispatch benchmark the sends were the largest
single cost of the provider call (BENCHMARKS.md, finding 2). The stream
below holds a request head back until the next write (the body: sent
together) or the next read (a request without a body: sent before it).

Under it, connections are asyncio's own (`apirunner.netstream`), not
anyio's: no transport paused and resumed around every read, no cancel scope
per read and write, TLS in the loop's SSL. Before reusing a kept-alive
connection, httpcore's pool asks every idle connection whether the server
closed it, on every request and every release; the loop has read whatever
came, so that answer is the stream's own state, no system call.

Nothing else changes: httpx and httpcore still build, send, time and read
every request, and every check above the transport stays where it is. Only
HTTP/1.1 heads are held back: a TLS connection that agreed on HTTP/2 keeps
its stream as it is (its frames interleave across requests, where holding
one back could wait on another request's read).
"""

# The `timeout` parameters are httpcore's stream and backend interface.
# ruff: noqa: ASYNC109

from __future__ import annotations

import contextlib
import ssl
from typing import Any

import httpcore
import httpx

from apirunner.netstream import AsyncioBackend

_HEAD_END = b"\r\n\r\n"
_HTTP11 = b" HTTP/1.1"
# A head is a few hundred bytes; anything larger is sent as it comes.
_MAX_HELD = 16 * 1024


def _is_request_head(buffer: bytes) -> bool:
    if len(buffer) > _MAX_HELD or not buffer.endswith(_HEAD_END):
        return False
    line_end = buffer.find(b"\r\n")
    return buffer[:line_end].endswith(_HTTP11)


class HeadHoldingStream(httpcore.AsyncNetworkStream):
    """One connection's stream; a request head waits for its body (or a read)."""

    def __init__(self, inner: httpcore.AsyncNetworkStream) -> None:
        self._inner = inner
        self._held = b""

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        if self._held:
            buffer, self._held = self._held + buffer, b""
        elif _is_request_head(buffer):
            self._held = buffer
            return
        await self._inner.write(buffer, timeout)

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        if self._held:
            held, self._held = self._held, b""
            # What httpcore does with a failed request write: read on, the
            # server may have answered (an early 4xx) before closing.
            with contextlib.suppress(httpcore.WriteError):
                await self._inner.write(held, timeout)
        return await self._inner.read(max_bytes, timeout)

    async def aclose(self) -> None:
        self._held = b""
        await self._inner.aclose()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.AsyncNetworkStream:
        tls = await self._inner.start_tls(ssl_context, server_hostname, timeout)
        ssl_object = tls.get_extra_info("ssl_object")
        if ssl_object is not None and ssl_object.selected_alpn_protocol() == "h2":
            return tls
        return HeadHoldingStream(tls)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


def head_holding_transport(
    ssl_context: ssl.SSLContext, limits: httpx.Limits
) -> httpx.AsyncHTTPTransport:
    """httpx's own transport (HTTP/1.1 and HTTP/2, this TLS context, these
    limits: what `httpx.AsyncClient(http2=True, ...)` builds), its pool on
    asyncio's transports (`netstream.AsyncioBackend`), each connection's
    stream a `HeadHoldingStream`."""
    transport = httpx.AsyncHTTPTransport(verify=ssl_context, http2=True, limits=limits)
    # httpx has no parameter for httpcore's network backend: the pool is
    # built again, with the same settings, on ours.
    transport._pool = httpcore.AsyncConnectionPool(
        ssl_context=ssl_context,
        max_connections=limits.max_connections,
        max_keepalive_connections=limits.max_keepalive_connections,
        keepalive_expiry=limits.keepalive_expiry,
        http1=True,
        http2=True,
        network_backend=AsyncioBackend(wrap=HeadHoldingStream),
    )
    return transport


def slot_pool(transport: httpx.AsyncHTTPTransport) -> httpcore.AsyncConnectionPool:
    """The httpcore pool under a transport `head_holding_transport` built."""
    pool = transport._pool
    assert isinstance(pool, httpcore.AsyncConnectionPool)
    return pool
