"""Run an ASGI app with uvicorn inside the current event loop on loopback.

Used by the service itself and by the bundled demo backends. Binding is
always 127.0.0.1: there is deliberately no parameter for the host.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import resource
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal, cast

import h11
import uvicorn
from starlette.types import ASGIApp
from uvicorn.protocols.http.h11_impl import H11Protocol

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    HTTPTOOLS = True
except ImportError:  # pragma: no cover - a dependency; h11 is the fallback
    HttpToolsProtocol = H11Protocol  # type: ignore[misc,assignment]
    HTTPTOOLS = False

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


class _OneSendTransport:
    """A connection's transport that sends a response's head with its body.

    uvicorn writes the status line and headers, then the body, as two
    writes: two sends, two segments (TCP_NODELAY), two wake-ups of the
    client, for every answer. A head is held back instead until the next
    write (the body, sent with it) or, at the latest, the end of this turn
    of the event loop (a response without a body, a 100 Continue); closing
    sends it first. Everything else is the real transport's.
    """

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._held = b""
        self._flush_handle: asyncio.Handle | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        if self._held:
            data = self._held + bytes(data)
            self._held = b""
            if self._flush_handle is not None:
                self._flush_handle.cancel()
                self._flush_handle = None
        elif _is_response_head(data):
            self._held = bytes(data)
            self._flush_handle = asyncio.get_running_loop().call_soon(self.flush)
            return
        self._transport.write(data)

    def flush(self) -> None:
        self._flush_handle = None
        held, self._held = self._held, b""
        if held and not self._transport.is_closing():
            self._transport.write(held)

    def close(self) -> None:
        if self._flush_handle is not None:
            self._flush_handle.cancel()
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        self._held = b""
        self._transport.abort()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


_MAX_HEAD = 16 * 1024


def _is_response_head(data: bytes | bytearray | memoryview) -> bool:
    head = bytes(data[:9])
    return head == b"HTTP/1.1 " and len(data) <= _MAX_HEAD and bytes(data[-4:]) == b"\r\n\r\n"


# Seconds a client may take to send a request's head (the request line and
# headers), from connecting or from the first byte after an answer: a local
# client sends it in one write; a half-open or dribbling connection is closed.
HEAD_TIMEOUT_S = 10.0
# And for its body (at most 1 MiB, read as it comes by the security
# middleware), from the end of the head.
BODY_TIMEOUT_S = 30.0
# Open connections at most, however many files the process may open; below
# that, a quarter of RLIMIT_NOFILE (the rest is for the database, browsers'
# pipes, vendors' connections, result files, and connections just accepted
# that are about to be closed).
MAX_CONNECTIONS = 1024
MIN_CONNECTIONS = 16
ACCEPT_BACKLOG = 128


def connection_cap() -> int:
    """The open-connection cap for the process's file limit now (it may be
    lowered while the service runs, with prlimit)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_CONNECTIONS
    return max(MIN_CONNECTIONS, min(MAX_CONNECTIONS, soft // 4))


class _OneSend(asyncio.Protocol):
    """What both of uvicorn's HTTP/1.1 protocols get: answers written
    through `_OneSendTransport`; flow control (pausing and resuming reads)
    stays on the real transport, and so does a websocket that takes over.

    And two guards uvicorn lacks (its keep-alive timeout starts only after
    a first answer): a request head must arrive within `head_timeout_s` and
    its body within `body_timeout_s` after it, and
    past `connection_cap()` open connections a new one closes the idle
    connection that has waited longest (for a head, else for its next
    request), or, when none is idle, is closed itself. An idle or dribbling
    client can then neither hold the service's files for ever nor keep an
    operator with the token out.
    """

    transport: asyncio.Transport
    # uvicorn's, declared for the type checker.
    loop: asyncio.AbstractEventLoop
    cycle: Any
    head_timeout_s: float = HEAD_TIMEOUT_S
    body_timeout_s: float = BODY_TIMEOUT_S

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._real_transport = transport
        self.transport = cast(asyncio.Transport, _OneSendTransport(transport))
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_cycle: Any = None
        # The request whose body the timer waits for; None: waiting for a head.
        self._body_of: Any = None
        self._idle_since = self.loop.time()
        self._arm_head_timer()
        self._keep_under_cap()

    def data_received(self, data: bytes) -> None:
        if self._head_timer is None and self._idle():
            self._arm_head_timer()  # the first bytes of the next request
        super().data_received(data)
        if self._head_timer is None:
            return
        if self._body_of is None:
            if self.cycle is not self._head_cycle:  # the head is in: a request began
                self._disarm_head_timer()
                if self.cycle.more_body:
                    self._body_of = self.cycle
                    self._head_timer = self.loop.call_later(
                        self.body_timeout_s, self._head_timed_out
                    )
        elif self.cycle is not self._body_of or not self._body_of.more_body:
            self._disarm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_timer()
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        self._idle_since = self.loop.time()

    def _idle(self) -> bool:
        return self.cycle is None or bool(self.cycle.response_complete)

    def _arm_head_timer(self) -> None:
        self._head_cycle = self.cycle
        self._body_of = None
        self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_timed_out)

    def _disarm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        self._body_of = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if not self._real_transport.is_closing():
            self._real_transport.close()

    def _keep_under_cap(self) -> None:
        cap = connection_cap()
        # uvicorn's set of this server's connections (websockets' included).
        connections: set[asyncio.Protocol] = cast(Any, self).connections
        open_ = [p for p in connections if not _closing(p)]
        if len(open_) <= cap:
            return
        idle = [p for p in open_ if p is not self and isinstance(p, _OneSend) and p._idle()]
        if not idle:
            self._real_transport.close()
            return
        # Waiting for a head before waiting between requests; the longest first.
        victim = min(idle, key=lambda p: (p._head_timer is None, p._idle_since))
        victim._real_transport.close()

    def _back_to_the_real_transport(self) -> None:
        self._disarm_head_timer()
        if isinstance(self.transport, _OneSendTransport):
            self.transport.flush()
        self.transport = self._real_transport


def _closing(protocol: asyncio.Protocol) -> bool:
    transport = getattr(protocol, "transport", None)
    return transport is None or bool(transport.is_closing())


class _OneSendH11Protocol(_OneSend, H11Protocol):
    """uvicorn's h11 (pure Python) protocol, one send per answer."""

    def handle_websocket_upgrade(self, event: h11.Request) -> None:
        self._back_to_the_real_transport()
        super().handle_websocket_upgrade(event)


class _OneSendHttpToolsProtocol(_OneSend, HttpToolsProtocol):
    """uvicorn's httptools (llhttp) protocol, one send per answer.

    Each request's cycle is given the protocol's transport when its head has
    been parsed, so it writes through the wrapper as well."""

    def handle_websocket_upgrade(self) -> None:
        self._back_to_the_real_transport()
        super().handle_websocket_upgrade()


HttpParser = Literal["auto", "httptools", "h11"]
HTTP_PARSERS: tuple[HttpParser, ...] = ("auto", "httptools", "h11")


def http_protocol(parser: str = "auto") -> type[asyncio.Protocol]:
    """uvicorn's protocol class for `parser`, with one send per answer.

    httptools (the llhttp parser in C, uvicorn's own pick when installed)
    parses a request and writes an answer's head for a fraction of h11's
    CPU; h11 (pure Python) remains the fallback.
    """
    if parser not in HTTP_PARSERS:
        raise ConfigError(f"HTTP parser must be one of {', '.join(HTTP_PARSERS)}, not {parser!r}")
    if parser == "h11" or (parser == "auto" and not HTTPTOOLS):
        return _OneSendH11Protocol
    if not HTTPTOOLS:
        raise ConfigError("HTTP parser httptools asked for, but it cannot be imported")
    return _OneSendHttpToolsProtocol


def protocol_name(protocol: type[asyncio.Protocol]) -> str:
    return "httptools" if issubclass(protocol, _OneSendHttpToolsProtocol) else "h11"


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
    http_parser: str = "h11"
    # Ours until uvicorn has served on it; closed again at stop either way
    # (a server cancelled before it listened never closed it, and the
    # unclosed socket surfaced later as a ResourceWarning in some other test).
    sock: socket.socket | None = None

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    async def stop(self) -> None:
        self.server.should_exit = True
        try:
            # A server slower than this to end (a loaded machine) is cancelled
            # below: a TimeoutError here left its listening socket open.
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                await asyncio.wait_for(asyncio.shield(self.task), timeout=5)
            if not self.task.done():
                self.task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await self.task
        finally:
            if self.sock is not None:
                self.sock.close()


async def start_server(
    app: ASGIApp,
    port: int | None = None,
    *,
    access_log: bool = False,
    random_port: bool = True,
    http_parser: str = "auto",
    head_timeout_s: float = HEAD_TIMEOUT_S,
    body_timeout_s: float = BODY_TIMEOUT_S,
) -> RunningServer:
    """Serve `app` on 127.0.0.1 and return once it accepts connections.

    With `port=None` and `random_port`, a free port in 49152-65535 is chosen;
    with `random_port=False` the OS picks one (port 0).
    """
    base = http_protocol(http_parser)
    timeouts = {"head_timeout_s": head_timeout_s, "body_timeout_s": body_timeout_s}
    protocol = type(base.__name__, (base,), timeouts)
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
        http=protocol,
        # Also how many connections one wake-up of the loop accepts before
        # any runs the cap (uvicorn's 2,048 would take all of a 1,024-file
        # limit at once under a flood of connections).
        backlog=ACCEPT_BACKLOG,
    )
    server = _EmbeddedServer(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                task.result()
                raise ConfigError(f"server on port {bound_port} stopped while starting")
            await asyncio.sleep(0.01)
    except BaseException:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        sock.close()
        raise
    return RunningServer(
        server=server,
        task=task,
        port=bound_port,
        http_parser=protocol_name(protocol),
        sock=sock,
    )
