"""The provider pool's streams: a request head leaves with its body, in one send."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import httpcore
import pytest

from apirunner.netstream import AsyncioStream, StreamConnection
from apirunner.wire import HeadHoldingStream

HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n"


class Recorder(httpcore.AsyncNetworkStream):
    def __init__(self, sock: socket.socket | None = None, fail_writes: bool = False) -> None:
        self.sent: list[bytes] = []
        self.reads = 0
        self.sock = sock
        self.fail_writes = fail_writes

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:  # noqa: ASYNC109
        if self.fail_writes:
            raise httpcore.WriteError("closed")
        self.sent.append(buffer)

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:  # noqa: ASYNC109
        self.reads += 1
        return b"HTTP/1.1 200 OK\r\n\r\n"

    async def aclose(self) -> None:
        pass

    def get_extra_info(self, info: str) -> Any:
        return self.sock if info == "socket" else f"inner:{info}"


async def test_the_head_leaves_with_the_body() -> None:
    inner = Recorder()
    stream = HeadHoldingStream(inner)
    await stream.write(HEAD)
    assert inner.sent == []
    await stream.write(b"{}")
    await stream.write(b"")  # h11's end of a Content-Length body
    assert inner.sent == [HEAD + b"{}"]
    await stream.read(100)
    assert inner.sent == [HEAD + b"{}"] and inner.reads == 1


async def test_a_head_without_a_body_leaves_before_the_read() -> None:
    inner = Recorder()
    stream = HeadHoldingStream(inner)
    head = b"GET /status/1 HTTP/1.1\r\nHost: x\r\n\r\n"
    await stream.write(head)
    await stream.read(100)
    assert inner.sent == [head] and inner.reads == 1


@pytest.mark.parametrize(
    "data",
    [
        b'{"a": 1}',  # a body
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",  # HTTP/2's preface: not HTTP/1.1
        b"POST / HTTP/1.1\r\n" + b"X: " + b"y" * 20000 + b"\r\n\r\n",  # too large to hold
    ],
)
async def test_anything_but_a_request_head_is_sent_at_once(data: bytes) -> None:
    inner = Recorder()
    await HeadHoldingStream(inner).write(data)
    assert inner.sent == [data]


async def test_a_failed_held_write_still_reads_the_answer() -> None:
    # As httpcore does: the server may have answered before it closed.
    inner = Recorder(fail_writes=True)
    stream = HeadHoldingStream(inner)
    await stream.write(HEAD)
    assert await stream.read(100) == b"HTTP/1.1 200 OK\r\n\r\n"


async def test_readable_is_the_connections_own_state() -> None:
    # The loop reads as data comes: "did the server close this idle
    # connection?" is answered from what arrived, no system call.
    ours, theirs = socket.socketpair()
    loop = asyncio.get_running_loop()
    transport, connection = await loop.create_connection(StreamConnection, sock=ours)
    stream = HeadHoldingStream(AsyncioStream(transport, connection))
    try:
        assert stream.get_extra_info("is_readable") is False
        theirs.close()  # the server closed: reading would give b""
        for _ in range(100):
            if stream.get_extra_info("is_readable"):
                break
            await asyncio.sleep(0.01)
        assert stream.get_extra_info("is_readable") is True
        assert await stream.read(100) == b""
    finally:
        await stream.aclose()
        theirs.close()
