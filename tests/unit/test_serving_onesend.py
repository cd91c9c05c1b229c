"""The server's transport: a response's head leaves with its body, in one send."""

from __future__ import annotations

import asyncio
from typing import Any

from dispatcher.service.serving import _OneSendTransport

HEAD = b"HTTP/1.1 201 Created\r\ncontent-length: 2\r\ncontent-type: application/json\r\n\r\n"


class Recorder:
    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.closed = self.aborted = False

    def write(self, data: bytes) -> None:
        self.sent.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed or self.aborted

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def get_extra_info(self, name: str) -> Any:
        return f"real:{name}"


def wrap() -> tuple[_OneSendTransport, Recorder]:
    real = Recorder()
    return _OneSendTransport(real), real  # type: ignore[arg-type]


async def test_the_head_leaves_with_the_body() -> None:
    transport, real = wrap()
    transport.write(HEAD)
    assert real.sent == []
    transport.write(b"{}")
    transport.write(b"")  # h11's end of a Content-Length body
    assert real.sent == [HEAD + b"{}"]
    await asyncio.sleep(0)
    assert real.sent == [HEAD + b"{}"]


async def test_a_head_alone_leaves_by_the_end_of_the_turn() -> None:
    transport, real = wrap()
    transport.write(b"HTTP/1.1 204 No Content\r\n\r\n")
    await asyncio.sleep(0)
    assert real.sent == [b"HTTP/1.1 204 No Content\r\n\r\n"]


async def test_close_sends_the_held_head_first_and_abort_drops_it() -> None:
    transport, real = wrap()
    transport.write(HEAD)
    transport.close()
    assert real.sent == [HEAD] and real.closed
    transport, real = wrap()
    transport.write(HEAD)
    transport.abort()
    await asyncio.sleep(0)
    assert real.sent == [] and real.aborted


async def test_a_body_chunk_is_sent_at_once_and_the_rest_is_the_real_transport() -> None:
    transport, real = wrap()
    transport.write(b"data: {}\n\n")
    assert real.sent == [b"data: {}\n\n"]
    assert transport.get_extra_info("peername") == "real:peername"
