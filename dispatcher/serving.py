"""Run an ASGI app with uvicorn inside the current event loop on loopback.

Used by the service itself and by the bundled demo backends. Binding is
always 127.0.0.1: there is deliberately no parameter for the host.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
from collections.abc import Iterator
from dataclasses import dataclass

import uvicorn
from starlette.types import ASGIApp

from dispatcher.errors import ConfigError

LOOPBACK = "127.0.0.1"
EPHEMERAL_RANGE = (49152, 65535)
PORT_TRIES = 10


def _bind(port: int) -> socket.socket:
    # IPPROTO_TCP spelled out, not 0: accepted sockets inherit the listener's
    # proto, and asyncio sets TCP_NODELAY only when it reads IPPROTO_TCP there.
    # Without it Nagle holds every answer's body until the client's delayed
    # ACK (~40 ms), since uvicorn writes headers and body separately.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((LOOPBACK, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def bind_loopback(port: int | None) -> socket.socket:
    """A listening-ready socket on 127.0.0.1: the given port, or a random free one."""
    if port is not None:
        try:
            return _bind(port)
        except OSError as exc:
            raise ConfigError(f"cannot bind 127.0.0.1:{port}: {exc.strerror}") from exc
    last: OSError | None = None
    for _ in range(PORT_TRIES):
        candidate = random.randint(*EPHEMERAL_RANGE)
        try:
            return _bind(candidate)
        except OSError as exc:
            last = exc
    raise ConfigError(f"no free port in {EPHEMERAL_RANGE} after {PORT_TRIES} tries: {last}")


class _EmbeddedServer(uvicorn.Server):
    """A uvicorn server that leaves signal handling to whoever embeds it."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@dataclass
class RunningServer:
    server: uvicorn.Server
    task: asyncio.Task[None]
    port: int

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    async def stop(self) -> None:
        self.server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(self.task), timeout=5)
        if not self.task.done():
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.task


async def start_server(
    app: ASGIApp,
    port: int | None = None,
    *,
    access_log: bool = False,
    random_port: bool = True,
) -> RunningServer:
    """Serve `app` on 127.0.0.1 and return once it accepts connections.

    With `port=None` and `random_port`, a free port in 49152-65535 is chosen;
    with `random_port=False` the OS picks one (port 0).
    """
    sock = bind_loopback(port) if (port is not None or random_port) else _bind(0)
    bound_port = sock.getsockname()[1]
    config = uvicorn.Config(
        app,
        log_level="warning",
        # No dictConfig of uvicorn's own: its lines go through the root handler,
        # which redacts secrets and honours the JSON format.
        log_config=None,
        access_log=access_log,
        lifespan="off",
        # Loopback only, never behind a proxy: X-Forwarded-* must not be
        # believed (nor parsed for every request), and no header needs to
        # name the server software.
        proxy_headers=False,
        server_header=False,
        timeout_graceful_shutdown=2,
    )
    server = _EmbeddedServer(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            task.result()
            raise ConfigError(f"server on port {bound_port} stopped while starting")
        await asyncio.sleep(0.01)
    return RunningServer(server=server, task=task, port=bound_port)
