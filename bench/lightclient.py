"""The submitting side of the dispatch benchmarks: a light HTTP/1.1 client.

The benchmarks' client runs on the same two cores as the service it
measures, so every millisecond of CPU it burns per request is one the
service does not get. httpx's AsyncClient spent ~2 ms of CPU per `POST
/v1/tasks` (request and response models, header normalisation, h11's
validation, anyio), as much as the service spent on the whole task; the
peers' clients enqueue with one Redis command or SQL statement each, a
fraction of that. This client is still real HTTP on a real socket: one
keep-alive HTTP/1.1 connection, one request in flight, `Content-Length`
bodies (what uvicorn sends for a JSON answer), the local token in the
`Authorization` header; it only skips what a benchmark does not need
(redirects, cookies, chunked answers, TLS).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any
from urllib.parse import urlsplit


class LightClient:
    """One keep-alive connection to the service; `post_json` one request at a time."""

    def __init__(self, url: str, token: str) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or parts.hostname is None or parts.port is None:
            raise ValueError(f"a plain http://host:port URL, not {url!r}")
        self.host, self.port = parts.hostname, parts.port
        self._head = (
            f"Host: {parts.netloc}\r\nAuthorization: Bearer {token}\r\n"
            "Content-Type: application/json\r\nAccept: application/json\r\n"
        ).encode("latin-1")
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self._reader is None or self._writer is None or self._writer.is_closing():
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        return self._reader, self._writer

    async def post_json(self, path: str, body: Any, tries: int = 4) -> tuple[int, bytes]:
        """(status, body) of one POST; sent again on a fresh connection when the
        kept-alive one was closed under it (uvicorn's 5 s idle timeout on a
        loaded machine), as `bench.common.call` does for httpx."""
        data = json.dumps(body, separators=(",", ":")).encode()
        request = (
            f"POST {path} HTTP/1.1\r\n".encode("latin-1")
            + self._head
            + f"Content-Length: {len(data)}\r\n\r\n".encode("latin-1")
            + data
        )
        for attempt in range(tries):
            try:
                return await self._exchange(request)
            except (OSError, asyncio.IncompleteReadError, ConnectionError):
                await self.aclose()
                if attempt == tries - 1:
                    raise
                await asyncio.sleep(0.05 * (attempt + 1))
        raise AssertionError("unreachable")

    async def _exchange(self, request: bytes) -> tuple[int, bytes]:
        reader, writer = await self._connect()
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        length = 0
        close = False
        for line in lines[1:]:
            name, _, value = line.partition(":")
            name = name.strip().lower()
            if name == "content-length":
                length = int(value)
            elif name == "transfer-encoding":
                raise ValueError(f"unexpected Transfer-Encoding {value.strip()!r}")
            elif name == "connection" and value.strip().lower() == "close":
                close = True
        answer = await reader.readexactly(length)
        if close:
            await self.aclose()
        return status, answer

    async def aclose(self) -> None:
        writer, self._reader, self._writer = self._writer, None, None
        if writer is not None:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def __aenter__(self) -> LightClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
