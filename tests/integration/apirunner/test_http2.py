"""The provider's client against a real HTTP/2 server over TLS (hypercorn).

Vendors answer in HTTP/2 when the client offers it, as ours does
(`build_http_client`): the protocol is chosen by ALPN during the TLS
handshake, which our own network streams (`apirunner.netstream`) carry, and
h2's flow control then reads and writes through them. A request body and an
answer larger than h2's windows must arrive whole, and the lane's slots
still bound its connections.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvloop
from hypercorn.asyncio import serve
from hypercorn.config import Config

from apirunner.client import build_http_client
from apirunner.gate import RetryGate
from dispatcher.allowlist import Allowlist
from dispatcher.clock import SystemClock

ANSWER_BYTES = 4 * 1024 * 1024  # far over h2's default window (64 KiB)
BODY_BYTES = 300_000
Scope = dict[str, Any]
Message = dict[str, Any]


class App:
    """An ASGI app that records what it was asked, over which protocol and
    which connection, and answers the body's length (or a large answer)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, int, tuple[str, int]]] = []

    async def __call__(
        self,
        scope: Scope,
        receive: Callable[[], Awaitable[Message]],
        send: Callable[[Message], Awaitable[None]],
    ) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.seen.append((scope["http_version"], scope["path"], len(body), scope["client"]))
        if scope["path"] == "/large":
            answer = bytes(range(256)) * (ANSWER_BYTES // 256)
        else:
            answer = b'{"received": %d}' % len(body)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": answer})


def _tls_h2_config(cert: Path, key: Path) -> tuple[Config, int]:
    """hypercorn's configuration for a socket bound here (port 0: a free
    one); the server takes the socket over and closes it when it stops."""
    listening = socket.create_server(("127.0.0.1", 0))
    port = listening.getsockname()[1]
    config = Config()
    config.bind = [f"fd://{listening.detach()}"]
    config.certfile, config.keyfile = str(cert), str(key)
    config.alpn_protocols = ["h2", "http/1.1"]
    config.accesslog = None
    config.errorlog = None
    return config, port


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_the_provider_client_speaks_http2_over_tls_to_a_real_server(
    certificate: tuple[Path, Path], loop: str
) -> None:
    cert, key = certificate
    app = App()
    config, port = _tls_h2_config(cert, key)
    base = f"https://localhost:{port}"

    async def main() -> None:
        stop = asyncio.Event()
        server = asyncio.create_task(serve(app, config, shutdown_trigger=stop.wait))  # type: ignore[arg-type]
        client = build_http_client(
            2,
            10.0,
            Allowlist.from_base_urls([base]),
            ssl.create_default_context(cafile=str(cert)),
            RetryGate(SystemClock()),
        )
        try:
            async with client:
                first = await client.post(f"{base}/first", json={"n": 1})
                assert (first.status_code, first.http_version) == (200, "HTTP/2")
                # Six bodies over h2's window at once, on the lane's two slots.
                answers = await asyncio.gather(
                    *(client.post(f"{base}/body/{n}", content=b"x" * BODY_BYTES) for n in range(6))
                )
                assert [a.json()["received"] for a in answers] == [BODY_BYTES] * 6
                assert {a.http_version for a in answers} == {"HTTP/2"}
                large = await client.get(f"{base}/large")
                assert large.content == bytes(range(256)) * (ANSWER_BYTES // 256)
        finally:
            stop.set()
            await server

    factory = uvloop.new_event_loop if loop == "uvloop" else asyncio.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(main())
    assert {version for version, *_ in app.seen} == {"2"}
    assert sorted(path for _, path, _, _ in app.seen) == sorted(
        ["/first", "/large", *(f"/body/{n}" for n in range(6))]
    )
    # Two slots: at most two connections, each a client port of its own.
    assert len({client for *_, client in app.seen}) <= 2


def test_an_untrusted_certificate_is_refused_over_http2_too(
    certificate: tuple[Path, Path],
) -> None:
    cert, key = certificate
    config, port = _tls_h2_config(cert, key)
    base = f"https://localhost:{port}"

    async def main() -> None:
        stop = asyncio.Event()
        server = asyncio.create_task(serve(App(), config, shutdown_trigger=stop.wait))  # type: ignore[arg-type]
        client = build_http_client(
            1,
            10.0,
            Allowlist.from_base_urls([base]),
            ssl.create_default_context(),
            RetryGate(SystemClock()),
        )
        try:
            async with client:
                with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                    await client.get(f"{base}/x")
        finally:
            stop.set()
            await server

    asyncio.run(main())
