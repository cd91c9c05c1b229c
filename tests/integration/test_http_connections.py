"""Connections to the local API: idle and half-open ones, and ambiguous heads."""

from __future__ import annotations

import asyncio
import resource
import selectors
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from dispatcher.service.serving import HTTP_PARSERS, start_server
from tests.support.harness import running_service
from tests.support.servicecli import start_service

pytestmark = pytest.mark.timeout(240)

PARTIAL_HEAD = b"GET /v1/lanes HTTP/1.1\r\nHost: 127.0.0.1\r\n"  # never ends


@contextmanager
def half_open(port: int, count: int, within_s: float) -> Iterator[list[socket.socket]]:
    """`count` connections that each send the start of a request head and
    nothing more; the ones connected within `within_s`."""
    pending: list[socket.socket] = []
    connected: list[socket.socket] = []
    selector = selectors.DefaultSelector()
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setblocking(False)
            sock.connect_ex(("127.0.0.1", port))
            pending.append(sock)
            selector.register(sock, selectors.EVENT_WRITE)
        deadline = time.monotonic() + within_s
        while len(connected) < count and time.monotonic() < deadline:
            for key, _ in selector.select(timeout=0.5):
                sock = key.fileobj  # type: ignore[assignment]
                selector.unregister(sock)
                if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                    try:
                        sock.send(PARTIAL_HEAD)
                    except OSError:
                        continue
                    connected.append(sock)
        yield connected
    finally:
        selector.close()
        for sock in pending:
            sock.close()


def closed_by_server(socks: list[socket.socket]) -> int:
    """How many of `socks` the server has closed (EOF or reset waiting)."""
    closed = 0
    for sock in socks:
        try:
            data = sock.recv(1)
        except BlockingIOError:
            continue
        except OSError:
            closed += 1
            continue
        closed += data == b""
    return closed


@pytest.mark.parametrize("event_loop", ["uvloop", "asyncio"])
async def test_a_flood_of_half_open_connections_does_not_keep_the_operator_out(
    tmp_path: Path, event_loop: str
) -> None:
    service = start_service(tmp_path, env={"DISPATCHER_EVENT_LOOP": event_loop})
    try:
        # The usual limit of a service (systemd's default soft limit).
        resource.prlimit(service.popen.pid, resource.RLIMIT_NOFILE, (1024, 1024))
        port = int(service.url.rsplit(":", 1)[1])
        with half_open(port, 1100, within_s=30) as attackers:
            assert len(attackers) >= 1000, len(attackers)
            started = time.monotonic()
            # Generous: on main this never answers (every file is taken).
            with httpx.Client(
                base_url=service.url,
                headers={"Authorization": f"Bearer {service.token}"},
                timeout=httpx.Timeout(30.0, connect=30.0),
            ) as client:
                answer = await asyncio.to_thread(client.get, "/v1/lanes")
            took_s = time.monotonic() - started
            assert answer.status_code == 200, answer.text
            # Past the cap (a quarter of 1,024 files) the oldest idle ones were
            # closed at once; the rest when their head timeout (10 s) ran out.
            deadline = time.monotonic() + 60
            while (closed := closed_by_server(attackers)) < len(attackers):
                assert time.monotonic() < deadline, (closed, len(attackers))
                await asyncio.sleep(0.2)
            all_closed_s = time.monotonic() - started
            print(f"answered in {took_s:.2f} s; all {closed} closed after {all_closed_s:.1f} s")
        assert service.popen.poll() is None
    finally:
        assert service.stop() == 0, service.log()[-3000:]


@pytest.mark.parametrize("parser", HTTP_PARSERS[1:])
async def test_a_request_that_never_ends_is_closed_after_the_read_timeouts(
    parser: str,
) -> None:
    async def hello(request: Request) -> PlainTextResponse:
        try:
            await request.body()
        except ClientDisconnect:
            return PlainTextResponse("gone")
        return PlainTextResponse("hello")

    app = Starlette(routes=[Route("/", hello, methods=["GET", "POST"])])
    server = await start_server(app, http_parser=parser, head_timeout_s=0.5, body_timeout_s=0.5)
    writers: list[asyncio.StreamWriter] = []
    try:
        loop = asyncio.get_running_loop()
        # Silent after connecting; a partial head; a body 10 bytes of 100;
        # one whole request then a partial second one (the timeout starts
        # again after an answer).
        silent = await asyncio.open_connection("127.0.0.1", server.port)
        partial = await asyncio.open_connection("127.0.0.1", server.port)
        body = await asyncio.open_connection("127.0.0.1", server.port)
        second = await asyncio.open_connection("127.0.0.1", server.port)
        writers = [silent[1], partial[1], body[1], second[1]]
        partial[1].write(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        body[1].write(
            b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n" + b"x" * 10
        )
        second[1].write(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        head = await second[0].readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200")
        await second[0].readexactly(5)
        second[1].write(b"GET / HTTP/1.1\r\n")
        started = loop.time()
        for reader in (silent[0], partial[0], second[0]):
            # EOF from the server, well before the test's own timeout.
            assert await asyncio.wait_for(reader.read(), timeout=30) == b""
        # The app saw the client go away (and answered no one).
        assert await asyncio.wait_for(body[0].read(), timeout=30) == b""
        assert loop.time() - started < 30
        # A client that sends its head at once is served as before.
        async with httpx.AsyncClient(base_url=server.url) as client:
            assert (await client.get("/")).text == "hello"
            assert (await client.post("/", content=b"y" * 100_000)).text == "hello"
    finally:
        for writer in writers:
            writer.close()
        await server.stop()


async def test_two_host_headers_are_refused(tmp_path: Path) -> None:
    async with running_service(tmp_path) as h:
        port = h.service.http.port  # type: ignore[union-attr]
        token = h.service.credentials.token
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            b"GET /v1/lanes HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: evil.example\r\n"
            + f"Authorization: Bearer {token}\r\nConnection: close\r\n\r\n".encode()
        )
        answer = await asyncio.wait_for(reader.read(), timeout=30)
        writer.close()
        assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
        assert b"exactly one Host header" in answer
        one = await h.http.get("/v1/lanes")
        assert one.status_code == 200
