"""`open_stream` and the bounded reads, against httpx's MockTransport (no sockets)."""

from __future__ import annotations

import gzip
import hashlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import pytest

from dispatcher.errors import HostNotAllowed, PermanentError, TransientError
from dispatcher.fetch import (
    ERROR_BODY_BYTES,
    MAX_HOPS,
    Outbound,
    open_stream,
    origin_of,
    read_capped,
    read_error_text,
    save_stream,
)

HOME = "http://127.0.0.1:5000"
OTHER = "http://127.0.0.1:5001"  # allowlisted, another port
FOREIGN = "http://127.0.0.1:5002"  # named by nothing


class Allow:
    def __init__(self, *bases: str) -> None:
        self.origins = {origin_of(b) for b in bases}

    def check(self, url: str | httpx.URL) -> None:
        if origin_of(url) not in self.origins:
            raise HostNotAllowed(f"outbound request to {url} refused")


def client(handler: Callable[[httpx.Request], httpx.Response]) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.MockTransport(handler))


def secret_call(url: str, method: str = "GET") -> Outbound:
    return Outbound(
        method,
        url,
        headers={"Accept": "application/json"},
        credentials={"X-Api-Key": "k-123456", "Cookie": "sid=1"},
        credentials_origin=origin_of(HOME),
        json={"prompt": "p"} if method == "POST" else None,
    )


async def test_credentials_stay_on_their_origin_across_redirects() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.port == 5000 and request.url.path == "/start":
            return httpx.Response(307, headers={"location": f"{OTHER}/next"})
        if request.url.port == 5001:
            return httpx.Response(302, headers={"location": f"{HOME}/back"})
        return httpx.Response(200, json={"ok": True})

    async with (
        client(handler) as http,
        open_stream(http, Allow(HOME, OTHER), secret_call(f"{HOME}/start", "POST")) as response,
    ):
        assert response.status_code == 200
    start, elsewhere, back = seen
    assert start.headers["x-api-key"] == "k-123456" and start.headers["cookie"] == "sid=1"
    assert "x-api-key" not in elsewhere.headers and "cookie" not in elsewhere.headers
    assert elsewhere.method == "POST"  # a 307 repeats the request, body and all
    assert elsewhere.content == start.content
    assert back.method == "GET" and back.content == b""  # a 302 after a POST is a GET
    assert back.headers["x-api-key"] == "k-123456"  # home again: its own key


async def test_a_hop_off_the_allowlist_is_refused_before_it_is_sent() -> None:
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url))
        return httpx.Response(302, headers={"location": f"{FOREIGN}/steal"})

    with pytest.raises(HostNotAllowed):
        async with client(handler) as http, open_stream(http, Allow(HOME), secret_call(HOME)):
            pass
    assert seen == [HOME]


async def test_redirects_are_bounded() -> None:
    count = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal count
        count += 1
        return httpx.Response(302, headers={"location": "/again"})

    with pytest.raises(PermanentError) as caught:
        async with client(handler) as http, open_stream(http, Allow(HOME), secret_call(HOME)):
            pass
    assert caught.value.kind == "redirects"
    assert count == MAX_HOPS + 1


async def _endless() -> AsyncIterator[bytes]:
    while True:
        yield b"x" * 1024


async def test_error_bodies_and_json_answers_are_read_only_so_far() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(500, content=_endless())

    async with client(handler) as http, open_stream(http, Allow(HOME), secret_call(HOME)) as r:
        text = await read_error_text(r)
    assert len(text) == ERROR_BODY_BYTES

    async with client(handler) as http, open_stream(http, Allow(HOME), secret_call(HOME)) as r:
        with pytest.raises(PermanentError) as caught:
            await read_capped(r, 64 * 1024, "the answer")
    assert caught.value.kind == "too_large"


async def test_a_declared_length_over_the_cap_is_refused_unread() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-length": str(10**12)}, content=_endless())

    async with client(handler) as http, open_stream(http, Allow(HOME), secret_call(HOME)) as r:
        with pytest.raises(PermanentError, match="larger than the limit of 100 bytes"):
            await read_capped(r, 100, "the answer")


async def test_a_compressed_file_is_checked_against_its_length_on_the_wire(
    tmp_path: Path,
) -> None:
    body = b"\x89PNG" + b"\x00" * 50_000
    packed = gzip.compress(body)

    def handler(request: httpx.Request) -> httpx.Response:
        headers = {"content-encoding": "gzip", "content-type": "image/png"}
        return httpx.Response(200, headers=headers, content=packed)

    async with client(handler) as http, open_stream(http, Allow(HOME), secret_call(HOME)) as r:
        saved = await save_stream(r, tmp_path, stem="t", max_bytes=10**6)
    assert Path(saved.path).read_bytes() == body
    assert saved.sha256 == hashlib.sha256(body).hexdigest()


async def test_a_short_body_or_one_over_the_cap_leaves_no_file(tmp_path: Path) -> None:
    def short(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-length": "100"}, content=b"x" * 10)

    def endless(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=_endless())

    async with client(short) as http, open_stream(http, Allow(HOME), secret_call(HOME)) as r:
        with pytest.raises(TransientError, match="10 of 100"):
            await save_stream(r, tmp_path, stem="t", max_bytes=10**6)
    async with client(endless) as http, open_stream(http, Allow(HOME), secret_call(HOME)) as r:
        with pytest.raises(PermanentError, match="larger than the limit"):
            await save_stream(r, tmp_path, stem="t", max_bytes=10_000)
    assert list(tmp_path.iterdir()) == []


async def test_a_second_file_of_one_name_never_overwrites_the_first(tmp_path: Path) -> None:
    bodies = iter([b"first picture", b"second picture", b"third picture"])

    def handler(request: httpx.Request) -> httpx.Response:
        headers = {"content-disposition": 'attachment; filename="ComfyUI_00001_.png"'}
        return httpx.Response(200, headers=headers, content=next(bodies))

    saved = []
    async with client(handler) as http:
        for _ in range(3):
            async with open_stream(http, Allow(HOME), secret_call(HOME)) as r:
                saved.append(await save_stream(r, tmp_path, stem="t", max_bytes=10**6))
    assert [s.name for s in saved] == [
        "ComfyUI_00001_.png",
        "ComfyUI_00001_-2.png",
        "ComfyUI_00001_-3.png",
    ]
    assert [Path(s.path).read_bytes() for s in saved] == [
        b"first picture",
        b"second picture",
        b"third picture",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(s.name for s in saved)
