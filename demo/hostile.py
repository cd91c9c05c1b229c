"""A hostile vendor and a hostile web page, for the test suite only.

One Starlette app plays both. Its answers are the shapes that once hurt the
dispatcher (issue 11): redirects off the allowlist, a cross-origin 307 that
records which headers reached it, a 401 that echoes the API key, endless and
huge answers, deeply nested JSON, path-changing job ids, hostile file names,
and a chat page whose media live on another port. Tests run several
instances (an allowlisted one, a second allowlisted one, a foreign one) and
read each one's `GET /__stats`: every request with its headers, submits and
uploads per shape, bytes served.

The vendor API, per shape (``/{shape}/...``, see `SHAPES`):

- ``POST /{shape}/jobs`` submits; the answer depends on the shape.
- ``GET /{shape}/jobs/{id}/status`` answers the job's status.
- ``GET /{shape}/jobs/{id}/content`` answers the result file.
- ``POST /{shape}/uploads`` takes a reference image (multipart) and names it.

The page: ``GET /page`` sets a session cookie and shows a composer; sending a
prompt shows an answer and, as ``<video class="result">``, the media listed by
``POST /__config`` (``{"media": [...]}``). ``POST /__config`` also names ``elsewhere`` and
``other``: the base URLs redirects point at; ``download`` (a URL the page
downloads on send), ``popups`` (URLs it opens with ``window.open``) and
``images`` (URLs it shows as ``<img>``): what the browser itself reaches.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Route

from demo.api_media import png_bytes
from dispatcher.service.serving import RunningServer, start_server

__all__ = ["SESSION_COOKIE", "SHAPES", "create_app", "start_hostile"]

SESSION_COOKIE = "hostile_session"
SESSION_VALUE = "s3ss10n-" + "c" * 24
NESTED_DEPTH = 10_000
CHUNK = 64 * 1024

# Every shape the vendor API knows, and where it strikes.
SHAPES = {
    "plain": "a well-behaved job: id, completed, a small PNG",
    "key_echo": "submit answers 401 echoing the credential header it received",
    "nested_submit": "submit answers 10,000-deep JSON",
    "dotdot": "submit names the job '..' (the status path would become /dotdot/status)",
    "slash": "submit names the job 'a/b'",
    "nested": "status answers 10,000-deep JSON",
    "huge": "status answers a JSON document of `huge_bytes` (default 64 MiB), streamed",
    "nan": "status answers NaN and Infinity",
    "endless": "content never ends",
    "attachment": "content never ends, sent as an attachment (a browser downloads it)",
    "drip": "content never ends, one small chunk every 20 ms",
    "dripfile": "as drip, sent as an attachment: a download that never ends nor passes a cap",
    "longname": "content's Content-Disposition names a 300-character file",
    "dotname": "content's file name is ../../x",
    "nulname": "content's file name holds a NUL",
    "offsite": "content redirects (302) to the `elsewhere` host",
    "crossorigin": "content redirects (307) to the `other` host, which records headers",
    "loop": "content redirects to itself, forever",
    "nul422": "submit answers 422 whose error message holds a NUL",
    "nulfail": "status answers failed, its error holding a NUL",
    "recorded": "a well-behaved job (tests make the store refuse its result)",
    "nested_upload": "the reference upload answers 100,000-deep JSON",
    "bigid_upload": "the reference upload names its file with a 10 MB id",
}
NUL_TEXT = "invalid prompt\x00 rejected"
UPLOAD_NESTED_DEPTH = 100_000
BIG_UPLOAD_ID_CHARS = 10 * 1024 * 1024


@dataclass
class HostileState:
    requests: list[dict[str, Any]] = field(default_factory=list)
    submits: Counter[str] = field(default_factory=Counter)
    uploads: Counter[str] = field(default_factory=Counter)
    bytes_served: int = 0
    elsewhere: str = ""
    other: str = ""
    media: list[str] = field(default_factory=list)
    huge_bytes: int = 64 * 1024 * 1024
    download: str = ""
    download_times: int = 1  # how many times the page starts `download`
    popups: list[str] = field(default_factory=list)
    images: list[str] = field(default_factory=list)
    open_streams: int = 0  # endless answers still being sent

    def reset(self) -> None:
        self.requests.clear()
        self.submits.clear()
        self.uploads.clear()
        self.bytes_served = 0
        self.media = []
        self.download = ""
        self.download_times = 1
        self.popups = []
        self.images = []

    def stats(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "request_count": len(self.requests),
            "submits": dict(self.submits),
            "uploads": dict(self.uploads),
            "bytes_served": self.bytes_served,
            "open_streams": self.open_streams,
        }


def _nested(depth: int) -> bytes:
    return b'{"status":' + b"[" * depth + b"]" * depth + b"}"


class Hostile:
    def __init__(self) -> None:
        self.state = HostileState()

    def _record(self, request: Request) -> None:
        self.state.requests.append(
            {
                "method": request.method,
                "path": request.url.path,
                "headers": {k.lower(): v for k, v in request.headers.items()},
            }
        )

    def _bytes(self, data: bytes, **kwargs: Any) -> Response:
        self.state.bytes_served += len(data)
        return Response(data, **kwargs)

    async def _endless(self, pause_s: float, head: bytes = b"") -> AsyncIterator[bytes]:
        if head:
            self.state.bytes_served += len(head)
            yield head
        chunk = b"x" * (CHUNK if pause_s == 0 else 512)
        self.state.open_streams += 1
        try:
            while True:
                self.state.bytes_served += len(chunk)
                yield chunk
                # Always yield to the loop: the client under test shares it.
                await asyncio.sleep(pause_s)
        finally:
            self.state.open_streams -= 1

    async def _sized(self, head: bytes, total: int, tail: bytes) -> AsyncIterator[bytes]:
        self.state.bytes_served += len(head)
        yield head
        left = total
        while left > 0:
            piece = b"x" * min(CHUNK, left)
            left -= len(piece)
            self.state.bytes_served += len(piece)
            yield piece
            await asyncio.sleep(0)
        self.state.bytes_served += len(tail)
        yield tail

    # -- the vendor API ----------------------------------------------------

    async def submit(self, request: Request) -> Response:
        self._record(request)
        shape = request.path_params["shape"]
        self.state.submits[shape] += 1
        if shape == "key_echo":
            sent = request.headers.get("x-api-key") or request.headers.get("authorization") or ""
            body = {"error": {"message": f"Incorrect API key provided: Bearer {sent}"}}
            return JSONResponse(body, status_code=401)
        if shape == "nested_submit":
            return self._bytes(_nested(NESTED_DEPTH), media_type="application/json")
        if shape == "nul422":
            return JSONResponse({"error": {"message": NUL_TEXT}}, status_code=422)
        job_id = {"dotdot": "..", "slash": "a/b"}.get(shape, "job-1")
        return JSONResponse({"id": job_id, "status": "queued"})

    async def status(self, request: Request) -> Response:
        self._record(request)
        shape = request.path_params["shape"]
        if shape == "nested":
            return self._bytes(_nested(NESTED_DEPTH), media_type="application/json")
        if shape == "huge":
            stream = self._sized(b'{"status": "running", "pad": "', self.state.huge_bytes, b'"}')
            return StreamingResponse(stream, media_type="application/json")
        if shape == "nulfail":
            return JSONResponse({"status": "failed", "error": NUL_TEXT})
        if shape == "nan":
            body = b'{"status": "completed", "progress": NaN, "eta": Infinity}'
            return self._bytes(body, media_type="application/json")
        return JSONResponse({"status": "completed", "progress": 100})

    async def content(self, request: Request) -> Response:
        self._record(request)
        shape = request.path_params["shape"]
        png = png_bytes(shape)
        if shape == "endless":
            return StreamingResponse(self._endless(0.0), media_type="application/octet-stream")
        if shape == "attachment":
            return StreamingResponse(
                self._endless(0.0),
                media_type="application/octet-stream",
                headers={"Content-Disposition": 'attachment; filename="big.bin"'},
            )
        if shape == "drip":
            return StreamingResponse(self._endless(0.02), media_type="application/octet-stream")
        if shape == "dripfile":
            return StreamingResponse(
                self._endless(0.02),
                media_type="application/octet-stream",
                headers={"Content-Disposition": 'attachment; filename="slow.bin"'},
            )
        names = {
            "longname": "n" * 296 + ".png",
            "dotname": "../../x",
        }
        if shape in names:
            disposition = f'attachment; filename="{names[shape]}"'
            return self._bytes(
                png, media_type="image/png", headers={"Content-Disposition": disposition}
            )
        if shape == "nulname":
            disposition = "attachment; filename*=UTF-8''" + quote("a\x00b.png", safe="")
            return self._bytes(
                png, media_type="image/png", headers={"Content-Disposition": disposition}
            )
        if shape == "offsite":
            return RedirectResponse(f"{self.state.elsewhere}/steal.png", status_code=302)
        if shape == "crossorigin":
            return RedirectResponse(f"{self.state.other}/collect.png", status_code=307)
        if shape == "loop":
            return RedirectResponse(str(request.url), status_code=302)
        return self._bytes(png, media_type="image/png")

    async def upload(self, request: Request) -> Response:
        self._record(request)
        shape = request.path_params["shape"]
        self.state.uploads[shape] += 1
        await request.body()
        if shape == "nested_upload":
            return self._bytes(_nested(UPLOAD_NESTED_DEPTH), media_type="application/json")
        file_id = "f" * BIG_UPLOAD_ID_CHARS if shape == "bigid_upload" else "file-1"
        return JSONResponse({"id": file_id})

    async def anything(self, request: Request) -> Response:
        """Where redirects land (`/steal.png`, `/collect.png`): a PNG, and a record."""
        self._record(request)
        return self._bytes(png_bytes(request.url.path), media_type="image/png")

    # -- the web page --------------------------------------------------------

    async def page(self, request: Request) -> Response:
        self._record(request)
        # <video preload="none">: the browser itself fetches nothing, so every
        # request a host sees for a medium came from the dispatcher.
        media = "".join(
            f'<video class="result" preload="none" src="{src}"></video>' for src in self.state.media
        )
        extras = {
            "download": self.state.download,
            "download_times": self.state.download_times,
            "popups": self.state.popups,
            "images": self.state.images,
        }
        html = _PAGE.replace("__MEDIA__", json.dumps(media)).replace(
            "__EXTRAS__", json.dumps(extras)
        )
        response = HTMLResponse(html)
        response.set_cookie(SESSION_COOKIE, SESSION_VALUE, httponly=True, samesite="lax")
        return response

    async def media_hop(self, request: Request) -> Response:
        """Media on the page's own origin that redirects to the `elsewhere` host."""
        self._record(request)
        return RedirectResponse(f"{self.state.elsewhere}/steal.png", status_code=302)

    # -- test controls -------------------------------------------------------

    async def get_stats(self, request: Request) -> Response:
        return JSONResponse(self.state.stats())

    async def post_reset(self, request: Request) -> Response:
        self.state.reset()
        return JSONResponse({"ok": True})

    async def post_config(self, request: Request) -> Response:
        body = await request.json()
        for key in (
            "elsewhere",
            "other",
            "media",
            "huge_bytes",
            "download",
            "download_times",
            "popups",
            "images",
        ):
            if key in body:
                setattr(self.state, key, body[key])
        return JSONResponse({"ok": True})

    def routes(self) -> list[Route]:
        return [
            Route("/__stats", self.get_stats, methods=["GET"]),
            Route("/__reset", self.post_reset, methods=["POST"]),
            Route("/__config", self.post_config, methods=["POST"]),
            Route("/page", self.page, methods=["GET"]),
            Route("/media/hop.png", self.media_hop, methods=["GET"]),
            Route("/{shape}/jobs", self.submit, methods=["POST"]),
            Route("/{shape}/uploads", self.upload, methods=["POST"]),
            Route("/{shape}/jobs/{id}/status", self.status, methods=["GET"]),
            Route("/{shape}/jobs/{id}/content", self.content, methods=["GET"]),
            Route("/{rest:path}", self.anything, methods=["GET", "POST", "PUT"]),
        ]


_PAGE = """<!doctype html>
<html><head><title>hostile</title></head><body>
<div id="composer"><textarea></textarea><button id="send">send</button></div>
<div id="log"></div>
<script>
document.getElementById('send').addEventListener('click', () => {
  const msg = document.createElement('div');
  msg.className = 'msg assistant';
  msg.textContent = 'here you go';
  msg.setAttribute('data-done', '1');
  const media = document.createElement('div');
  media.innerHTML = __MEDIA__;
  const extras = __EXTRAS__;
  for (const src of extras.images) {
    const img = document.createElement('img');
    img.src = src;
    media.append(img);
  }
  for (const url of extras.popups) window.open(url, '_blank');
  for (let i = 0; extras.download && i < extras.download_times; i++) {
    const a = document.createElement('a');
    a.href = extras.download + (i ? '?n=' + i : '');
    a.download = 'big.bin';
    document.body.append(a);
    a.click();
  }
  document.getElementById('log').append(msg, media);
});
</script>
</body></html>
"""


def create_app() -> Starlette:
    hostile = Hostile()
    app = Starlette(routes=hostile.routes())
    app.state.hostile = hostile
    return app


async def start_hostile(port: int | None = None) -> RunningServer:
    """Serve a hostile vendor and page on 127.0.0.1 (a random free port by default)."""
    return await start_server(create_app(), port)
