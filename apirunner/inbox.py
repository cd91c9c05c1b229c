"""A websocket's messages waiting to be read, bounded by bytes.

ComfyUI's socket carries what the runner follows (small JSON texts) and
much it never reads (binary preview frames, other prompts' messages, new
message types). A server that floods it must not grow the queue: binary
frames are dropped on arrival, texts are kept only while the queued texts
stay under a budget (characters; ComfyUI's JSON is ASCII, one byte each).
A dropped text could have been the end signal, so a drop leaves a `MISSED`
mark in its place; the runner polls the history on its schedule whatever
arrives, so the prompt's end is found either way.
"""

from __future__ import annotations

import asyncio
from typing import Final

# Queued texts, in bytes. ComfyUI's messages for one prompt are a few KB
# each; a reader that falls this far behind only needs the history anyway.
MAX_QUEUED_BYTES = 8 * 1024 * 1024
# Queued items; a full queue makes the socket wait (its own buffer is bounded).
MAX_QUEUED_ITEMS = 1000


class _Mark:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


CLOSED: Final = _Mark("CLOSED")  # the socket is gone
MISSED: Final = _Mark("MISSED")  # texts were dropped here

Item = str | _Mark


class Inbox:
    def __init__(self, max_bytes: int = MAX_QUEUED_BYTES) -> None:
        self.max_bytes = max_bytes
        self.queued_bytes = 0
        self.dropped = 0  # texts dropped for the byte budget
        self.skipped = 0  # binary frames, never queued
        self._queue: asyncio.Queue[Item] = asyncio.Queue(maxsize=MAX_QUEUED_ITEMS)
        self._marked = False  # a MISSED mark is queued and not read yet

    async def put(self, raw: str | bytes) -> None:
        if not isinstance(raw, str):
            self.skipped += 1
            return
        size = len(raw)
        if self.queued_bytes + size > self.max_bytes:
            self.dropped += 1
            if not self._marked:
                self._marked = True
                await self._queue.put(MISSED)
            return
        self.queued_bytes += size
        await self._queue.put(raw)

    def close(self) -> None:
        """Mark the end; when the queue is full the reader learns it by polling."""
        if not self._queue.full():
            self._queue.put_nowait(CLOSED)

    async def get(self) -> Item:
        item = await self._queue.get()
        if isinstance(item, str):
            self.queued_bytes -= len(item)
        elif item is MISSED:
            self._marked = False
        return item
