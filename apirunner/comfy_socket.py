"""ComfyUI's websocket for one attempt: opened, read into an inbox, reopened, closed.

Owns the socket under a prompt's client_id (`ComfySocket`): the connect (no
redirects, bounded frames, no compression), the reader task that queues each
message into a bounded `Inbox`, the wait for our prompt's next event, and the
reopen after an outage. Progress is a nicety: when the socket cannot be had,
or drops, the attempt follows the prompt by polling (`comfyui.py`).
"""

from __future__ import annotations

import asyncio
import contextlib

import websockets
from websockets.asyncio.client import ClientConnection, connect

from apirunner.comfy_protocol import read_message
from apirunner.inbox import CLOSED, MISSED, Inbox
from dispatcher.background import stop_background
from dispatcher.clock import Clock
from dispatcher.scheduling.protocol import RunContext

# A message larger than this closes the socket (the prompt is then followed
# by polling): ComfyUI's texts are KBs, its binary previews rarely 1 MB.
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
# Frames the websocket library buffers before it stops reading the socket:
# with MAX_MESSAGE_BYTES, what a flooding server can make it hold.
MAX_BUFFERED_FRAMES = 4


class _NoRedirects(connect):
    """The websocket client; a redirect could lead off the allowlist, so none
    is followed (ComfyUI's /ws never redirects)."""

    def process_redirect(self, exc: Exception) -> Exception | str:
        return exc


class ComfySocket:
    """The websocket an attempt follows its prompt on, and what it has read."""

    def __init__(self, ctx: RunContext, clock: Clock, *, open_timeout_s: float) -> None:
        self.ctx = ctx
        self.clock = clock
        self.open_timeout_s = open_timeout_s
        self.socket: ClientConnection | None = None
        self.inbox = Inbox()
        self.told_missed = False
        self.reader: asyncio.Task[None] | None = None

    @property
    def reading(self) -> bool:
        """A socket is open and read (else the prompt is followed by polling)."""
        return self.reader is not None

    def closed(self) -> None:
        """The reader saw the socket close: the prompt is followed by polling."""
        self.reader = None

    async def open(self, ws_url: str, headers: dict[str, str]) -> None:
        """Connect (the caller checked the URL against the allowlist) and start reading."""
        try:
            self.socket = await _NoRedirects(
                ws_url,
                additional_headers=headers,
                open_timeout=self.open_timeout_s,
                max_size=MAX_MESSAGE_BYTES,
                max_queue=MAX_BUFFERED_FRAMES,
                # No permessage-deflate: one small read could inflate into
                # many frames of MAX_MESSAGE_BYTES before the reading pauses.
                compression=None,
            )
        except (OSError, TimeoutError, websockets.InvalidHandshake) as exc:
            # Progress is a nicety: without the socket, polling still works.
            self.ctx.log.warning("no websocket (%s); following the prompt by polling", exc)
            return
        self.reader = asyncio.create_task(self._read(self.socket))

    async def _read(self, socket: ClientConnection) -> None:
        try:
            async for raw in socket:
                await self.inbox.put(raw)
        except websockets.ConnectionClosed as exc:
            if exc.sent is not None and exc.sent.code == 1009:  # message too big
                self.ctx.log.warning(
                    "websocket message over %d bytes; following the prompt by polling",
                    MAX_MESSAGE_BYTES,
                )
        finally:
            self.inbox.close()

    async def next_event(self, prompt_id: str, nominal_s: float) -> object:
        """Our next event, `CLOSED`, or None after `nominal_s` without one."""
        timeout_s = self.clock.scaled(nominal_s)
        try:
            async with asyncio.timeout(timeout_s):
                while True:
                    raw = await self.ctx.guard(self.inbox.get())
                    if raw is CLOSED:
                        return raw
                    if raw is MISSED:
                        # What was dropped may have been the end: the poll at
                        # the end of this wait (quiet or not) finds it.
                        if not self.told_missed:
                            self.told_missed = True
                            self.ctx.log.warning(
                                "websocket messages dropped (over %d queued characters)",
                                self.inbox.max_bytes,
                            )
                        continue
                    assert isinstance(raw, str)
                    event = read_message(raw, prompt_id)
                    if event is not None:
                        return event
        except TimeoutError:
            return None

    async def reopen(self, ws_url: str, headers: dict[str, str]) -> None:
        """The socket again, on a fresh inbox, once the old one is gone."""
        await self.close()
        self.inbox = Inbox()
        await self.open(ws_url, headers)

    async def close(self) -> None:
        reader, self.reader = self.reader, None
        if reader is not None:
            await stop_background(reader)
        socket, self.socket = self.socket, None
        if socket is not None:
            with contextlib.suppress(Exception):
                await socket.close()
