"""httpcore's network streams on asyncio's own transports (issue 31).

httpcore reaches the network through a backend (`httpcore.AsyncNetworkBackend`,
its documented extension point); on asyncio its default is anyio's. Per
request, anyio's stream paid for its generality: every read resumed and then
paused the transport's reading again (two `epoll_ctl` system calls on
uvloop), every read and write opened a cancel scope for its timeout, and
every send passed a cancellation checkpoint first. In the batch benchmark
those were ~7 % of the service's CPU, the provider call being half of it.

Here a connection is an `asyncio.Protocol` that keeps what arrives (reading
paused only when `HIGH_WATER_BYTES` wait unread) and wakes the one reader
waiting; a timeout is one timer on that wait. TLS is asyncio's own
(`loop.start_tls`: the loop's SSL, uvloop's in C), so an HTTPS vendor no
longer goes through anyio's TLS written in Python. Nothing above changes:
httpcore still frames, times and pools every request, httpx still builds and
checks it, and every error is httpcore's own (`ReadTimeout`, `ConnectError`,
...), so `apirunner.classify` sees what it saw.
"""

# The `timeout` parameters are httpcore's stream and backend interface.
# ruff: noqa: ASYNC109

from __future__ import annotations

import asyncio
import socket
import ssl
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, cast

import httpcore

# Unread bytes held before the socket is no longer read (the server then
# waits: TCP's own flow control); reading resumes below the low mark.
HIGH_WATER_BYTES = 256 * 1024
LOW_WATER_BYTES = 64 * 1024


class StreamConnection(asyncio.Protocol):
    """What a connection received, and the one read or write waiting on it."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.chunks: deque[bytes] = deque()
        self.buffered_bytes = 0
        self.reading_paused = False
        self.at_eof = False
        self.lost: Exception | None = None
        self.writing_paused = False
        # One read and one write may wait at once (HTTP/2 reads while it sends).
        self.reader: asyncio.Future[None] | None = None
        self.writer: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's are not asyncio.Transport subclasses).
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.chunks.append(data)
        self.buffered_bytes += len(data)
        if self.buffered_bytes > HIGH_WATER_BYTES and self.transport is not None:
            self.reading_paused = True
            self.transport.pause_reading()
        self._wake_reader()

    def eof_received(self) -> bool:
        self.at_eof = True
        self._wake_reader()
        return False  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self.at_eof = True
        self.lost = exc
        self.writing_paused = False
        self._wake_reader()
        self._wake_writer()

    def pause_writing(self) -> None:
        self.writing_paused = True

    def resume_writing(self) -> None:
        self.writing_paused = False
        self._wake_writer()

    def _wake_reader(self) -> None:
        _wake(self.reader)
        self.reader = None

    def _wake_writer(self) -> None:
        _wake(self.writer)
        self.writer = None

    async def readable(self, timeout: float | None) -> None:
        """Until something arrives or the connection ends; TimeoutError after
        `timeout` seconds."""
        waiter = self.reader = asyncio.get_running_loop().create_future()
        await _waited(waiter, timeout)

    async def writable(self, timeout: float | None) -> None:
        """Until the transport takes writes again or the connection ends."""
        waiter = self.writer = asyncio.get_running_loop().create_future()
        await _waited(waiter, timeout)

    def take(self, max_bytes: int) -> bytes:
        chunk = self.chunks.popleft()
        if len(chunk) > max_bytes:
            chunk, rest = chunk[:max_bytes], chunk[max_bytes:]
            self.chunks.appendleft(rest)
        self.buffered_bytes -= len(chunk)
        if self.reading_paused and self.buffered_bytes < LOW_WATER_BYTES:
            self.reading_paused = False
            if self.transport is not None and not self.transport.is_closing():
                self.transport.resume_reading()
        return chunk


def _wake(waiter: asyncio.Future[None] | None) -> None:
    if waiter is not None and not waiter.done():
        waiter.set_result(None)


async def _waited(waiter: asyncio.Future[None], timeout: float | None) -> None:
    if timeout is None:
        await waiter
        return
    timer = asyncio.get_running_loop().call_later(timeout, _expire, waiter)
    try:
        await waiter
    finally:
        timer.cancel()


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())


class AsyncioStream(httpcore.AsyncNetworkStream):
    """One connection (plain TCP or TLS) as httpcore reads and writes it."""

    def __init__(self, transport: asyncio.Transport, connection: StreamConnection) -> None:
        self._transport = transport
        self._connection = connection

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        connection = self._connection
        while not connection.chunks:
            if connection.at_eof:
                if connection.lost is not None:
                    raise httpcore.ReadError(str(connection.lost) or "connection lost")
                return b""  # the server closed: httpcore reads that as the end
            try:
                await connection.readable(timeout)
            except TimeoutError as exc:
                raise httpcore.ReadTimeout("timed out reading from the server") from exc
        return connection.take(max_bytes)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        connection = self._connection
        if connection.at_eof or self._transport.is_closing():
            raise httpcore.WriteError("the connection is closed")
        self._transport.write(buffer)
        while connection.writing_paused and not connection.at_eof:
            try:
                await connection.writable(timeout)
            except TimeoutError as exc:
                raise httpcore.WriteTimeout("timed out writing to the server") from exc
        if connection.lost is not None:
            raise httpcore.WriteError(str(connection.lost) or "connection lost")

    async def aclose(self) -> None:
        self._transport.close()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                tls = await loop.start_tls(
                    self._transport,
                    self._connection,
                    ssl_context,
                    server_hostname=server_hostname,
                )
        except TimeoutError as exc:
            self._transport.close()
            raise httpcore.ConnectTimeout("timed out in the TLS handshake") from exc
        except OSError as exc:  # ssl.SSLError and ConnectionError are ones
            self._transport.close()
            raise httpcore.ConnectError(str(exc)) from exc
        if tls is None:
            raise httpcore.ConnectError("the connection closed before the TLS handshake")
        self._connection.transport = tls
        return AsyncioStream(tls, self._connection)

    def get_extra_info(self, info: str) -> Any:
        if info == "is_readable":
            # httpcore's "has the server closed this idle connection?": the
            # loop reads as data comes, so the answer is already here.
            return bool(self._connection.chunks) or self._connection.at_eof
        if info == "client_addr":
            return self._transport.get_extra_info("sockname")
        if info == "server_addr":
            return self._transport.get_extra_info("peername")
        if info in ("socket", "ssl_object"):
            return self._transport.get_extra_info(info)
        return None


class AsyncioBackend(httpcore.AsyncNetworkBackend):
    """Connections opened by the running loop (`loop.create_connection`);
    `wrap` puts each new connection's stream in another (`wire`'s)."""

    def __init__(
        self, wrap: Callable[[AsyncioStream], httpcore.AsyncNetworkStream] | None = None
    ) -> None:
        self._wrap = wrap

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        local = None if local_address is None else (local_address, 0)
        opening = loop.create_connection(StreamConnection, host, port, local_addr=local)
        transport, connection = await _connected(opening, timeout, f"{host}:{port}")
        return self._opened(transport, connection, socket_options)

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        opening = asyncio.get_running_loop().create_unix_connection(StreamConnection, path)
        transport, connection = await _connected(opening, timeout, path)
        return self._opened(transport, connection, socket_options)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def _opened(
        self,
        transport: asyncio.Transport,
        connection: StreamConnection,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None,
    ) -> httpcore.AsyncNetworkStream:
        sock: socket.socket | None = transport.get_extra_info("socket")
        try:
            for option in socket_options or ():
                if sock is None:
                    break
                sock.setsockopt(*option)
        except OSError as exc:
            transport.close()
            raise httpcore.ConnectError(str(exc)) from exc
        stream = AsyncioStream(transport, connection)
        return stream if self._wrap is None else self._wrap(stream)


async def _connected(
    opening: Awaitable[tuple[asyncio.Transport, StreamConnection]],
    timeout: float | None,
    where: str,
) -> tuple[asyncio.Transport, StreamConnection]:
    """A connection opened within `timeout`; the loop's errors as httpcore's."""
    try:
        async with asyncio.timeout(timeout):
            return await opening
    except TimeoutError as exc:  # before OSError: it is one
        raise httpcore.ConnectTimeout(f"timed out connecting to {where}") from exc
    except OSError as exc:
        raise httpcore.ConnectError(str(exc)) from exc
