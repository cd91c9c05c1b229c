"""The provider's connections, against real sockets: asyncio's transports (TLS,
a kept-alive connection the server closed, a large answer, a silent server)
and one connection per slot of the lane's concurrency."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import pytest
import uvloop

from apirunner.slotpool import SlotTransport
from apirunner.wire import head_holding_transport

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def _answer(body: bytes, *, close: bool = False) -> bytes:
    head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\nContent-Type: text/plain\r\n"
    if close:
        head += "Connection: close\r\n"
    return head.encode() + b"\r\n" + body


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            await reader.readexactly(int(line.split(b":")[1]))
    return head


class Server:
    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.port = 0
        self._server: asyncio.Server | None = None

    async def start(self, tls: ssl.SSLContext | None = None) -> None:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            try:
                await self.handler(reader, writer)
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            finally:
                writer.close()

        self._server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=tls)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


Serve = Callable[..., Awaitable[Server]]


@pytest.fixture(params=["asyncio", "uvloop"])
def run_on(request: pytest.FixtureRequest) -> Callable[[Callable[[Serve], Awaitable[None]]], None]:
    """Runs a test's body on asyncio's loop and on uvloop's (the service's
    default), with servers that stop when it ends."""
    factory = uvloop.new_event_loop if request.param == "uvloop" else asyncio.new_event_loop

    def run(body: Callable[[Serve], Awaitable[None]]) -> None:
        async def main() -> None:
            servers: list[Server] = []

            async def serve(handler: Handler, tls: ssl.SSLContext | None = None) -> Server:
                server = Server(handler)
                await server.start(tls)
                servers.append(server)
                return server

            try:
                await body(serve)
            finally:
                for server in servers:
                    await server.stop()

        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(main())

    return run


def _client(context: ssl.SSLContext | None = None, timeout_s: float = 5.0) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=2, max_keepalive_connections=2)
    transport = head_holding_transport(context or ssl.create_default_context(), limits)
    return httpx.AsyncClient(transport=transport, timeout=timeout_s)


async def _answer_each(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while True:
        head = await _read_request(reader)
        path = head.split(b" ")[1]
        writer.write(_answer(b"you asked for " + path))
        await writer.drain()


def test_requests_over_tls_reuse_one_verified_connection(
    run_on: Callable[[Callable[[Serve], Awaitable[None]]], None], certificate: tuple[Path, Path]
) -> None:
    cert, key = certificate

    async def body(serve: Serve) -> None:
        server_side = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_side.load_cert_chain(cert, key)
        server = await serve(_answer_each, server_side)
        trusting = ssl.create_default_context(cafile=str(cert))
        async with _client(trusting) as client:
            for n in range(3):
                url = f"https://localhost:{server.port}/job/{n}"
                answer = await client.post(url, json={"n": n})
                assert answer.status_code == 200
                assert answer.text == f"you asked for /job/{n}"
            assert server.connections == 1
        # A certificate nobody vouched for is refused, as ever.
        async with _client() as client:
            with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                await client.get(f"https://localhost:{server.port}/x")

    run_on(body)


def test_a_kept_connection_the_server_closed_is_not_reused(
    run_on: Callable[[Callable[[Serve], Awaitable[None]]], None],
) -> None:
    async def answer_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(_answer(b"once"))  # keep-alive promised, then closed anyway
        await writer.drain()

    async def body(serve: Serve) -> None:
        server = await serve(answer_once)
        async with _client() as client:
            for _ in range(3):
                answer = await client.get(f"http://127.0.0.1:{server.port}/")
                assert answer.text == "once"
                await asyncio.sleep(0.05)  # the server's close arrives meanwhile
        assert server.connections == 3

    run_on(body)


def test_a_large_answer_arrives_whole(
    run_on: Callable[[Callable[[Serve], Awaitable[None]]], None],
) -> None:
    large = bytes(range(256)) * 16 * 1024  # 4 MiB: reading pauses and resumes

    async def answer_large(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(_answer(large))
        await writer.drain()

    async def body(serve: Serve) -> None:
        server = await serve(answer_large)
        async with _client() as client:
            answer = await client.get(f"http://127.0.0.1:{server.port}/big")
        assert answer.content == large

    run_on(body)


def test_a_silent_server_times_out_and_a_closed_port_does_not_connect(
    run_on: Callable[[Callable[[Serve], Awaitable[None]]], None],
) -> None:
    release = asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        await release.wait()

    async def body(serve: Serve) -> None:
        server = await serve(silent)
        async with _client(timeout_s=0.3) as client:
            with pytest.raises(httpx.ReadTimeout):
                await client.get(f"http://127.0.0.1:{server.port}/")
            release.set()
            await server.stop()
            with pytest.raises(httpx.ConnectError):
                await client.get(f"http://127.0.0.1:{server.port}/")

    run_on(body)


def _slots_client(slots: int, pool_s: float = 5.0) -> httpx.AsyncClient:
    transport = SlotTransport(ssl.create_default_context(), slots)
    return httpx.AsyncClient(transport=transport, timeout=httpx.Timeout(5.0, pool=pool_s))


def test_each_slot_keeps_one_connection_and_a_request_waits_for_a_free_one(
    run_on: Callable[[Callable[[Serve], Awaitable[None]]], None],
) -> None:
    async def body(serve: Serve) -> None:
        server = await serve(_answer_each)
        async with _slots_client(2) as client:
            url = f"http://127.0.0.1:{server.port}"
            first = await client.send(client.build_request("GET", f"{url}/1"), stream=True)
            second = await client.send(client.build_request("GET", f"{url}/2"), stream=True)
            third = asyncio.create_task(client.get(f"{url}/3"))
            await asyncio.sleep(0.1)
            assert not third.done()  # both connections are busy: it waits
            await first.aread()  # read whole: its connection is kept
            await first.aclose()
            assert (await third).text == "you asked for /3"
            await second.aread()
            await second.aclose()
            answers = await asyncio.gather(*(client.get(f"{url}/{n}") for n in range(10)))
            assert [a.text for a in answers] == [f"you asked for /{n}" for n in range(10)]
        assert server.connections == 2  # never more than the slots, each kept

    run_on(body)


def test_no_free_slot_within_the_pool_timeout_is_a_pool_timeout(
    run_on: Callable[[Callable[[Serve], Awaitable[None]]], None],
) -> None:
    async def body(serve: Serve) -> None:
        server = await serve(_answer_each)
        async with _slots_client(1, pool_s=0.2) as client:
            url = f"http://127.0.0.1:{server.port}"
            held = await client.send(client.build_request("GET", f"{url}/held"), stream=True)
            with pytest.raises(httpx.PoolTimeout):
                await client.get(f"{url}/waits")
            await held.aclose()
            assert (await client.get(f"{url}/after")).text == "you asked for /after"

    run_on(body)


def test_a_failed_request_gives_its_slot_back(
    run_on: Callable[[Callable[[Serve], Awaitable[None]]], None],
) -> None:
    async def body(serve: Serve) -> None:
        gone = await serve(_answer_each)
        await gone.stop()
        server = await serve(_answer_each)
        async with _slots_client(1, pool_s=0.5) as client:
            for _ in range(3):
                with pytest.raises(httpx.ConnectError):
                    await client.get(f"http://127.0.0.1:{gone.port}/")
            answer = await client.get(f"http://127.0.0.1:{server.port}/ok")
            assert answer.text == "you asked for /ok"

    run_on(body)


async def _answer_in_two_parts(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    body = b"x" * 2000
    while True:
        await _read_request(reader)
        writer.write(_answer(body)[:-1000])
        await writer.drain()
        await asyncio.sleep(0.0005)  # a window inside the answer for a cancel
        writer.write(body[-1000:])
        await writer.drain()


def test_a_request_cancelled_anywhere_once_or_twice_leaves_its_slot_usable(
    run_on: Callable[[Callable[[Serve], Awaitable[None]]], None],
) -> None:
    # httpcore can keep a connection a cancelled request left (half made, or
    # active when a second cancel cut the first one's clean-up), which no
    # later request may use: in a slot of one connection, every request
    # after it waited its whole pool timeout.
    async def body(serve: Serve) -> None:
        server = await serve(_answer_in_two_parts)
        transport = SlotTransport(ssl.create_default_context(), 1)
        url = f"http://127.0.0.1:{server.port}/"
        async with httpx.AsyncClient(transport=transport, timeout=5.0) as client:
            for turns in range(40):
                for second_after in (None, 0, 1, 3):
                    request = asyncio.create_task(client.post(url, json={"turns": turns}))
                    for _ in range(turns):
                        await asyncio.sleep(0)
                    request.cancel()
                    if second_after is not None:
                        for _ in range(second_after):
                            await asyncio.sleep(0)
                        request.cancel()
                    with contextlib.suppress(asyncio.CancelledError, httpx.HTTPError):
                        await request
                    async with asyncio.timeout(2.0):  # a wedged slot waits 5 s
                        answer = await client.get(url)
                    assert len(answer.content) == 2000
        # The cancels met the bad states (else this test proves nothing).
        assert transport.replaced > 0

    run_on(body)


def test_answers_read_whole_keep_their_slot_and_connection(
    run_on: Callable[[Callable[[Serve], Awaitable[None]]], None],
) -> None:
    async def body(serve: Serve) -> None:
        server = await serve(_answer_in_two_parts)
        transport = SlotTransport(ssl.create_default_context(), 2)
        async with httpx.AsyncClient(transport=transport, timeout=5.0) as client:
            url = f"http://127.0.0.1:{server.port}/"
            for _ in range(5):
                answers = await asyncio.gather(*(client.get(url) for _ in range(4)))
                assert all(len(a.content) == 2000 for a in answers)
        assert transport.replaced == 0
        assert server.connections == 2

    run_on(body)
