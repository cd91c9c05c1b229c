"""Webhooks against broken receivers: an endless answer, a header dripped for ever.

The receivers are raw TCP servers on 127.0.0.1 speaking just enough HTTP;
the service is the real one, in process.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.integration.test_webhooks import SECRET, _deliveries, receiver
from tests.support.harness import running_service

# Loopback socket buffers take a few MB before a writer blocks; the old
# reader took gigabytes.
SENT_BOUND_BYTES = 32 * 1024**2
DRIP_EVERY_S = 0.3  # well inside any per-read timeout
DEADLINE_S = 1.0
SLOTS_PER_RECEIVER = 2  # dispatcher.notify.webhooks.SLOTS_PER_RECEIVER


@dataclass
class RawReceiver:
    url: str = ""
    sent_bytes: int = 0
    connections: int = 0
    closed: int = 0
    most_open: int = 0
    handlers: set[asyncio.Task[Any]] = field(default_factory=set)


Answer = Callable[[RawReceiver, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def raw_receiver(answer: Answer) -> AsyncIterator[RawReceiver]:
    raw = RawReceiver()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        raw.handlers.add(task)
        raw.connections += 1
        raw.most_open = max(raw.most_open, raw.connections - raw.closed)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = re.search(rb"(?i)content-length: *(\d+)", head)
            await reader.readexactly(int(length[1]) if length else 0)
            await answer(raw, reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the dispatcher hung up: what these tests want
        finally:
            raw.closed += 1
            writer.close()
            raw.handlers.discard(task)

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    raw.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/hook"
    try:
        yield raw
    finally:
        server.close()
        for task in list(raw.handlers):
            task.cancel()
        await asyncio.gather(*raw.handlers, return_exceptions=True)
        await server.wait_closed()


async def endless_body(
    raw: RawReceiver, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    framed = b"10000\r\n" + b"x" * 0x10000 + b"\r\n"
    while True:
        writer.write(framed)
        raw.sent_bytes += len(framed)
        await writer.drain()


async def dripped_header(
    raw: RawReceiver, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    writer.write(b"HTTP/1.1 200 OK\r\n")
    while True:
        # A line every DRIP_EVERY_S (the receiver's behaviour), until the
        # dispatcher hangs up (EOF).
        with contextlib.suppress(TimeoutError):
            if await asyncio.wait_for(reader.read(1), DRIP_EVERY_S) == b"":
                return
        writer.write(b"X-Drip: 1\r\n")
        raw.sent_bytes += 11
        await writer.drain()


async def _until(check: Callable[[], Awaitable[bool]], timeout_s: float, what: str) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, what
        await asyncio.sleep(0.02)


async def test_an_endless_answer_is_read_a_few_kb_at_most(tmp_path: Path) -> None:
    async with (
        raw_receiver(endless_body) as raw,
        running_service(tmp_path, webhook_urls=[raw.url], webhook_secret=SECRET) as h,
    ):
        await h.http.post("/v1/accounts/demo/disable", json={"reason": "x"})

        async def delivered() -> bool:
            return any(i["ok"] for i in (await _deliveries(h))["items"])

        await _until(delivered, 30, "the 200 with an endless body counts as delivered")

        async def hung_up() -> bool:
            return raw.closed == raw.connections == 1

        await _until(hung_up, 30, "the dispatcher closes the connection")
        (item,) = (await _deliveries(h))["items"]
        assert (item["status"], item["attempt"], item["final"]) == (200, 1, True)
        assert raw.sent_bytes < SENT_BOUND_BYTES, raw.sent_bytes
        print(f"endless answer: {raw.sent_bytes} bytes sent before the hang-up")


async def test_a_dripping_receiver_neither_hangs_nor_starves_a_healthy_one(
    tmp_path: Path,
) -> None:
    async with (
        raw_receiver(dripped_header) as slow,
        receiver() as hook,
        running_service(
            tmp_path,
            webhook_urls=[slow.url, hook.url],
            webhook_secret=SECRET,
            webhook_deadline_s=DEADLINE_S,
        ) as h,
    ):
        started = time.monotonic()
        for _ in range(4):  # eight account.state_changed events
            await h.http.post("/v1/accounts/demo/disable", json={"reason": "x"})
            await h.http.post("/v1/accounts/demo/enable")
        await hook.wait_for(8, "account.state_changed", timeout_s=30)
        healthy_s = time.monotonic() - started

        async def slow_cut() -> bool:
            items = (await _deliveries(h))["items"]
            return any(i["url"] == slow.url and not i["ok"] for i in items)

        await _until(slow_cut, 30, "an attempt to the dripping receiver ends")
        cut = [i for i in (await _deliveries(h))["items"] if i["url"] == slow.url]
        assert all("deadline" in i["error"] and i["status"] is None for i in cut), cut
        # The whole attempt ends near the deadline, however the drip goes on.
        longest_ms = max(i["duration_ms"] for i in cut)
        assert longest_ms < DEADLINE_S * 1000 * 10, cut
        # Two slots for the slow receiver (the rest of its events wait; the
        # old code gave it all four). One more may show while a slot is handed
        # on: the next post can connect before the receiver reads the last EOF.
        assert slow.most_open <= SLOTS_PER_RECEIVER + 1, slow.most_open
        print(
            f"dripping receiver: healthy got 8/8 in {healthy_s:.2f}s; "
            f"slow attempts cut at {longest_ms:.0f} ms (deadline {DEADLINE_S}s); "
            f"at most {slow.most_open} open to it"
        )
