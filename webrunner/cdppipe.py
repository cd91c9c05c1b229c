"""Chromium's DevTools over a pipe, handed to Playwright as a one-time websocket.

A `--remote-debugging-port` is a loopback TCP port anyone on the machine may
open: another local user could take it from the process list and read every
logged-in session's cookies. Chromium's `--remote-debugging-pipe` speaks the
same protocol over two descriptors (3: commands in, 4: replies out, each
message ending in a NUL) that only the process holding them can use.

Playwright connects to a browser only through a websocket URL, so we relay:
a websocket server on 127.0.0.1 accepts exactly one connection, at a path
holding a 256-bit random token that appears on no command line and in no log,
and stops listening as soon as that connection is made. From then on nothing
listens at all; the session lives in our process's pipes.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import secrets
import socket
import subprocess
from collections.abc import Awaitable
from http import HTTPStatus
from typing import Any, TypeVar

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import WebSocketException
from websockets.http11 import Request, Response

T = TypeVar("T")
# How often a wait on the browser looks whether its process is still there.
EXIT_POLL_S = 0.02
# The descriptors Chromium reads commands from and writes replies to.
CHILD_IN_FD = 3
CHILD_OUT_FD = 4
# Bound on one DevTools message either way: a full-page screenshot or a
# page's HTML can be tens of MB; nothing we drive comes near this.
MAX_MESSAGE_BYTES = 256 * 1024 * 1024


class CdpPipe:
    """The pipes of one browser and the relay Playwright connects through."""

    def __init__(self) -> None:
        # Ours are close-on-exec (os.pipe's default); the child's ends are
        # placed at 3 and 4 by `child_setup` in the browser process only.
        self._child_in, self._to_browser = os.pipe()
        self._from_browser, self._child_out = os.pipe()
        # Descriptors still ours to close: a number closed twice may by then
        # be someone else's socket.
        self._owned = {self._child_in, self._to_browser, self._from_browser, self._child_out}
        self._token = secrets.token_urlsafe(32)
        self._server: Server | None = None
        self._taken = False
        self._relay: asyncio.Task[None] | None = None
        self._closed = False
        # DevTools messages relayed: commands to the browser, and its replies
        # and events. What driving a page costs the browser (and us) is
        # mostly per message: tests count them.
        self.commands = 0
        self.replies = 0

    def child_setup(self) -> None:
        """Run in the forked child before exec: the pipes at 3 and 4, and no
        other descriptor of ours inherited (close_fds would close 3 and 4 too)."""
        os.dup2(self._child_in, CHILD_IN_FD)
        os.dup2(self._child_out, CHILD_OUT_FD)
        for name in os.listdir("/proc/self/fd"):
            fd = int(name)
            if fd > CHILD_OUT_FD:
                with contextlib.suppress(OSError):
                    if os.get_inheritable(fd):
                        os.close(fd)

    def spawned(self) -> None:
        """The browser holds its ends now; ours of them would hide its exit."""
        self._release(self._child_in, self._child_out)

    def _release(self, *fds: int) -> None:
        for fd in fds:
            if fd in self._owned:
                self._owned.discard(fd)
                with contextlib.suppress(OSError):
                    os.close(fd)

    def _hand_over(self, fd: int, mode: str) -> Any:
        """`fd` as a file object whose closing (by a transport) closes it."""
        if fd not in self._owned:
            # Released by `close` meanwhile: the number may be someone else's now.
            raise OSError(errno.EBADF, "the DevTools pipe is closed")
        self._owned.discard(fd)
        return os.fdopen(fd, mode, 0)

    def discard(self) -> None:
        """Release every descriptor at once (the browser never started)."""
        self._closed = True
        self._release(*list(self._owned))

    async def open(self) -> str:
        """Listen for Playwright's one connection; the websocket URL to give it."""
        # The listening socket is ours until the server holds it: asyncio's
        # create_server, cancelled in its last step (a stop or a cancel while
        # a browser starts), drops the server it made, still listening.
        listener = socket.create_server(("127.0.0.1", 0))
        try:
            self._server = await serve(
                self._serve,
                sock=listener,
                process_request=self._check,
                max_size=MAX_MESSAGE_BYTES,
                compression=None,
                ping_interval=None,  # a pipe does not time out; a busy loop must not cut it
            )
        except BaseException:
            if listener.fileno() != -1:  # (uvloop takes the descriptor over at once)
                asyncio.get_running_loop().remove_reader(listener)
                listener.close()
            raise
        port = next(iter(self._server.sockets)).getsockname()[1]
        return f"ws://127.0.0.1:{port}/devtools/browser/{self._token}"

    def _check(self, connection: ServerConnection, request: Request) -> Response | None:
        if self._taken or not secrets.compare_digest(
            request.path, f"/devtools/browser/{self._token}"
        ):
            return connection.respond(HTTPStatus.FORBIDDEN, "no\n")
        self._taken = True
        return None

    async def _serve(self, ws: ServerConnection) -> None:
        if self._closed:
            return
        if self._server is not None:
            # Connected: nobody else gets to try.
            self._server.close(close_connections=False)
        self._relay = asyncio.current_task()
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=MAX_MESSAGE_BYTES)
        transports: list[asyncio.BaseTransport] = []
        try:
            read_transport, _ = await loop.connect_read_pipe(
                lambda: asyncio.StreamReaderProtocol(reader),
                self._hand_over(self._from_browser, "rb"),
            )
            transports.append(read_transport)
            write_transport, write_protocol = await loop.connect_write_pipe(
                asyncio.streams.FlowControlMixin, self._hand_over(self._to_browser, "wb")
            )
            transports.append(write_transport)
            writer = asyncio.StreamWriter(write_transport, write_protocol, None, loop)
            up = asyncio.ensure_future(self._up(ws, writer))
            down = asyncio.ensure_future(self._down(ws, reader))
            try:
                await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for job in (up, down):
                    job.cancel()
                await asyncio.gather(up, down, return_exceptions=True)
        finally:
            # Closing the command pipe tells Chromium its driver is gone.
            for transport in transports:
                transport.close()
            with contextlib.suppress(WebSocketException, OSError):
                await asyncio.wait_for(ws.close(), 2.0)

    async def _up(self, ws: ServerConnection, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(WebSocketException, OSError):
            async for message in ws:
                data = message.encode() if isinstance(message, str) else message
                writer.write(data + b"\0")
                self.commands += 1
                await writer.drain()

    async def _down(self, ws: ServerConnection, reader: asyncio.StreamReader) -> None:
        # LimitOverrunError: a message past MAX_MESSAGE_BYTES.
        ends = (WebSocketException, OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError)
        with contextlib.suppress(*ends):
            while True:
                data = await reader.readuntil(b"\0")
                self.replies += 1
                await ws.send(data[:-1].decode("utf-8", errors="replace"))

    async def close(self) -> None:
        """Stop listening and relaying, and release every descriptor; idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)
        relay = self._relay
        if relay is not None and not relay.done() and relay is not asyncio.current_task():
            relay.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await relay
        # What the relay did not take over (all of it, if it never ran).
        self._release(*list(self._owned))


class BrowserExited(Exception):
    """The browser process ended while we waited for it."""


async def until_exit(proc: subprocess.Popen[bytes], connect: Awaitable[T]) -> T:
    """`connect`, given up as soon as the browser process exits (it never will
    answer then; Playwright alone may notice only at its timeout)."""
    task = asyncio.ensure_future(connect)
    try:
        while not task.done():
            if proc.poll() is not None:
                raise BrowserExited(f"the browser exited with code {proc.returncode}")
            await asyncio.wait({task}, timeout=EXIT_POLL_S)
        return task.result()
    finally:
        if not task.done():
            task.cancel()
            await asyncio.wait({task})  # its end, not its error: ours is on its way
