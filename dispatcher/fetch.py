"""The one way anything is fetched from a vendor or a web page.

Both runners go through here (the API runner for JSON answers and result
files, the web runner for the media a page shows), so every outbound request
meets the same rules:

- Redirects are followed by us, hop by hop (never by httpx), at most
  `MAX_HOPS`; every hop's host is checked against the allowlist before a byte
  is sent to it.
- Credentials (an API key, a site's cookies) are bound to one origin, host
  AND port: a hop anywhere else goes without them. Cookies do not isolate
  ports, so a cookie of 127.0.0.1:A is never sent to 127.0.0.1:B.
- Everything read is bounded: JSON answers and error bodies by size, files by
  size (streamed to a ``.part`` file, hashed, checked against Content-Length),
  the whole request by a deadline. Going over is a permanent error, and no
  partial file is left behind.
- A JSON answer is decoded strictly: no NaN/Infinity, no lone surrogates,
  bounded depth. What does not decode is `BadJson`, never a RecursionError.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import mimetypes
import os
import re
import secrets
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from email.message import Message
from pathlib import Path
from typing import Any, Protocol

import httpx

from dispatcher.errors import PermanentError, TransientError
from dispatcher.scheduling.protocol import ResultFile

MAX_HOPS = 5
CHUNK = 64 * 1024
# An error answer is read only for its message.
ERROR_BODY_BYTES = 4 * 1024
# Deeper than any vendor's real answer; far below Python's recursion limit.
MAX_JSON_DEPTH = 64
# Bytes of a result file's name; well under every file system's 255.
MAX_NAME_BYTES = 120
# Result files of one name in one attempt's dir (`name`, `name-2`, ...).
MAX_SAME_NAME = 1000
_MAX_EXT = 16

_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_DEFAULT_PORTS = {"http": 80, "https": 443}
_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")
_SURROGATE = re.compile("[\ud800-\udfff]")


class BadJson(ValueError):
    """A 2xx answer that is not strict, bounded JSON."""


class HostCheck(Protocol):
    """The allowlist, as this module needs it: raise HostNotAllowed, or return."""

    def check(self, url: str | httpx.URL) -> None: ...


# -- origins -------------------------------------------------------------------


@dataclass(frozen=True)
class Origin:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def origin_of(url: str | httpx.URL) -> Origin | None:
    """Host and effective port; None for URLs that name no host or odd schemes."""
    if isinstance(url, httpx.URL):
        return _origin(url)
    return _origin_of_text(url)


# Every request checks its URL a few times (allowlist, credentials) and most
# URLs repeat (a chat endpoint, a status URL polled many times); parsing one
# with httpx costs more than the rest of the check together.
@functools.lru_cache(maxsize=256)
def _origin_of_text(url: str) -> Origin | None:
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError, ValueError):
        return None
    return _origin(parsed)


def _origin(parsed: httpx.URL) -> Origin | None:
    scheme = parsed.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not parsed.host:
        return None
    return Origin(parsed.host.lower().rstrip("."), parsed.port or _DEFAULT_PORTS[scheme])


class OriginJars:
    """Cookies kept per origin: what one origin set goes back to it alone."""

    def __init__(self) -> None:
        self._jars: dict[Origin, httpx.Cookies] = {}

    def apply(self, origin: Origin | None, request: httpx.Request) -> None:
        jar = self._jars.get(origin) if origin is not None else None
        if jar:
            jar.set_cookie_header(request)

    def extract(self, origin: Origin | None, response: httpx.Response) -> None:
        if origin is None or "set-cookie" not in response.headers:
            return
        self._jars.setdefault(origin, httpx.Cookies()).extract_cookies(response)


class NoCookies(httpx.Cookies):
    """A client's own jar, kept empty: it would send cookies across ports."""

    def extract_cookies(self, response: httpx.Response) -> None:
        return None


def without_cookie_jar(client: httpx.AsyncClient) -> httpx.AsyncClient:
    # httpx offers no way to pass its own Cookies subclass; the setter copies.
    client._cookies = NoCookies()
    return client


# -- one request, hop by hop -----------------------------------------------------


@dataclass(frozen=True)
class Outbound:
    """One request as the caller means it, before any redirect."""

    method: str
    url: str | httpx.URL  # parsed already, when the caller keeps parsed URLs
    headers: Mapping[str, str] = field(default_factory=dict)  # sent to every hop
    # Sent only to `credentials_origin`: an API key, a site's cookies.
    credentials: Mapping[str, str] = field(default_factory=dict)
    credentials_origin: Origin | None = None
    json: Any = None
    timeout: httpx.Timeout | None = None
    # A multipart upload instead of JSON: {"field": (filename, bytes, type)}
    # plus plain form fields (ComfyUI's /upload/image).
    files: Mapping[str, tuple[str, bytes, str]] | None = None
    form: Mapping[str, str] | None = None


def _next_method(status: int, method: str) -> str:
    # What browsers and httpx do: 303 always, and 301/302 after a POST, turn
    # into a GET without a body; 307/308 repeat the request as it was.
    if status == 303 and method != "HEAD":
        return "GET"
    if status in (301, 302) and method == "POST":
        return "GET"
    return method


@asynccontextmanager
async def open_stream(
    http: httpx.AsyncClient,
    allowlist: HostCheck,
    out: Outbound,
    *,
    jars: OriginJars | None = None,
    max_hops: int = MAX_HOPS,
) -> AsyncIterator[httpx.Response]:
    """The final answer of `out`, its body not read yet; redirects followed here."""
    url = out.url if isinstance(out.url, httpx.URL) else httpx.URL(out.url)
    method = out.method.upper()
    body = out.json
    files, form = out.files, out.form
    for _ in range(max_hops + 1):
        allowlist.check(url)
        origin = origin_of(url)
        headers = dict(out.headers)
        if out.credentials and origin is not None and origin == out.credentials_origin:
            headers.update(out.credentials)
        request = http.build_request(
            method,
            url,
            headers=headers,
            json=body,
            files=files,
            data=form,
            timeout=out.timeout if out.timeout is not None else http.timeout,
        )
        if jars is not None:
            jars.apply(origin, request)
        response = await http.send(request, stream=True, follow_redirects=False)
        try:
            if jars is not None:
                jars.extract(origin, response)
            location = response.headers.get("location")
            if response.status_code not in _REDIRECTS or not location:
                yield response
                return
        finally:
            await response.aclose()
        try:
            url = url.join(location)
        except httpx.InvalidURL as exc:
            raise PermanentError(
                f"{out.url} redirected to an invalid URL", kind="redirects"
            ) from exc
        new_method = _next_method(response.status_code, method)
        if new_method != method:
            body, files, form = None, None, None
        method = new_method
    raise PermanentError(f"{out.url}: more than {max_hops} redirects", kind="redirects")


@asynccontextmanager
async def deadline(seconds: float | None, what: str, label: str) -> AsyncIterator[None]:
    """Bound a whole request, hops and body included; going over is permanent."""
    if seconds is None:
        yield
        return
    try:
        async with asyncio.timeout(max(0.0, seconds)):
            yield
    except TimeoutError as exc:
        raise PermanentError(f"{what} took longer than {label}", kind="timeout") from exc


def too_large(what: str, limit: int) -> PermanentError:
    return PermanentError(f"{what} is larger than the limit of {limit} bytes", kind="too_large")


def _declared_length(response: httpx.Response) -> int | None:
    value = response.headers.get("content-length", "")
    return int(value) if value.isdigit() else None


async def read_capped(response: httpx.Response, max_bytes: int, what: str) -> bytes:
    """The whole body, or `too_large` as soon as it passes `max_bytes`."""
    declared = _declared_length(response)
    if declared is not None and declared > max_bytes:
        raise too_large(what, max_bytes)
    body = bytearray()
    async for chunk in response.aiter_bytes(CHUNK):
        body += chunk
        if len(body) > max_bytes:
            raise too_large(what, max_bytes)
    return bytes(body)


async def read_error_text(response: httpx.Response, limit: int = ERROR_BODY_BYTES) -> str:
    """The start of an error answer, for its message; the rest is never read."""
    body = bytearray()
    async for chunk in response.aiter_bytes(CHUNK):
        body += chunk
        if len(body) >= limit:
            break
    return bytes(body[:limit]).decode("utf-8", "replace")


# -- strict JSON -----------------------------------------------------------------


def _no_constants(name: str) -> Any:
    raise BadJson(f"the answer holds {name}, which is not JSON")


def _check_tree(data: Any, max_depth: int) -> None:
    """Depth and text of a decoded document, checked without recursion."""
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            if depth > max_depth:
                raise BadJson(f"the answer is nested deeper than {max_depth} levels")
            for key, value in node.items():
                if _SURROGATE.search(key):
                    raise BadJson("the answer holds an unpaired surrogate")
                stack.append((value, depth + 1))
        elif isinstance(node, list):
            if depth > max_depth:
                raise BadJson(f"the answer is nested deeper than {max_depth} levels")
            stack.extend((value, depth + 1) for value in node)
        elif isinstance(node, str) and _SURROGATE.search(node):
            raise BadJson("the answer holds an unpaired surrogate")


def decode_json(body: bytes, *, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Strict JSON, or BadJson; never a RecursionError."""
    try:
        data = json.loads(body, parse_constant=_no_constants)
    except RecursionError as exc:
        raise BadJson(f"the answer is nested deeper than {max_depth} levels") from exc
    except BadJson:
        raise
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise BadJson(f"the answer is not JSON: {str(exc)[:100]}") from exc
    if _may_break_limits(body, max_depth):
        _check_tree(data, max_depth)
    return data


def _may_break_limits(body: bytes, max_depth: int) -> bool:
    """Whether the decoded tree needs walking: every answer used to be walked,
    a fifth of the CPU of reading a small one. Each level of nesting opens
    with a `{` or `[` (counted in strings too: that only over-counts). A lone
    surrogate reaches the decoded text through a `\\u` escape, or as raw
    bytes (`json.loads` decodes with surrogatepass, UTF-16 and -32 too): a
    body of ASCII without NUL is UTF-8 to it, and holds no raw ones."""
    if not body.isascii() or b"\x00" in body or b"\\u" in body:
        return True
    return body.count(b"{") + body.count(b"[") > max_depth


# -- files -------------------------------------------------------------------------


def safe_file_name(raw: str, fallback: str, max_bytes: int = MAX_NAME_BYTES) -> str:
    """A name that is one plain file in its directory, short enough for any disk.

    Only letters, digits, ``.``, ``_`` and ``-`` survive; no directory part,
    no leading dot. A long name keeps its extension and gains a short hash of
    the original, so two long names that share a start stay apart.
    """
    base = raw.replace("\\", "/").rsplit("/", 1)[-1]
    name = _SAFE_NAME.sub("_", base).strip("._")
    if not name:
        return fallback
    if len(name) <= max_bytes:
        return name
    stem, dot, ext = name.rpartition(".")
    suffix = f".{ext}" if dot and stem and len(ext) <= _MAX_EXT else ""
    if not suffix:
        stem = name
    tag = hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    keep = max(1, max_bytes - len(suffix) - len(tag) - 1)
    return f"{stem[:keep].rstrip('._-') or 'file'}-{tag}{suffix}"


def result_file_name(
    url: str | httpx.URL, content_disposition: str | None, content_type: str, stem: str
) -> str:
    """A safe file name: the server's, else the URL's last segment, else stem+ext."""
    name = ""
    if content_disposition:
        msg = Message()
        try:
            msg["content-disposition"] = content_disposition
            name = msg.get_filename() or ""
        except (ValueError, LookupError):
            name = ""
    if not name:
        last = httpx.URL(url).path.rstrip("/").rsplit("/", 1)[-1]
        name = last if "." in last else ""
    ext = mimetypes.guess_extension(content_type.split(";")[0].strip()) or ".bin"
    return safe_file_name(name, f"{stem}{ext}")


def claim_name(partial: Path, dest_dir: Path, name: str) -> Path:
    """Give `partial` the name `name` in `dest_dir`, or `name-2`, `name-3`...
    when that is taken: a result file is never overwritten (two outputs of one
    name, e.g. ComfyUI's ``a/x.png`` and ``b/x.png``, are two files)."""
    stem, dot, ext = name.rpartition(".")
    if not dot or not stem:
        stem, ext = name, ""
    suffix = f".{ext}" if ext else ""
    for number in range(1, MAX_SAME_NAME + 1):
        candidate = dest_dir / (name if number == 1 else f"{stem}-{number}{suffix}")
        try:
            # A hard link fails when the name exists, where a rename would replace it.
            os.link(partial, candidate)
        except FileExistsError:
            continue
        except OSError:
            # A file system without hard links: look, then rename (no other
            # writer shares an attempt's result dir, so the look is enough).
            if candidate.exists():
                continue
            partial.replace(candidate)
            return candidate
        partial.unlink()
        return candidate
    raise PermanentError(
        f"more than {MAX_SAME_NAME} result files named {name!r}", kind="too_many_files"
    )


async def save_stream(
    response: httpx.Response,
    dest_dir: Path,
    *,
    stem: str,
    max_bytes: int,
    prefix: str = "",
    on_chunk: Callable[[], None] | None = None,
) -> ResultFile:
    """Stream a 2xx answer to ``dest_dir``: a ``.part`` file, hashed, then renamed.

    Larger than `max_bytes` (declared or actual) is permanent; a body shorter
    than its Content-Length is transient (the connection dropped). Either way,
    and on cancel, the partial file is removed.
    """
    what = f"the file at {response.request.url}"
    declared = _declared_length(response)
    if declared is not None and declared > max_bytes:
        raise too_large(what, max_bytes)
    content_type = response.headers.get("content-type", "application/octet-stream")
    name = prefix + result_file_name(
        response.request.url, response.headers.get("content-disposition"), content_type, stem
    )
    await asyncio.to_thread(dest_dir.mkdir, parents=True, exist_ok=True)
    # Unique per download: two files of one name in flight never share a part file.
    partial = dest_dir / f".{name}.{secrets.token_hex(4)}.part"
    digest = hashlib.sha256()
    size = 0
    try:
        # Writes are synchronous on purpose: a 64 KiB chunk to local disk
        # takes microseconds, less than a thread hop would.
        with partial.open("wb") as out:
            async for chunk in response.aiter_bytes(CHUNK):
                size += len(chunk)
                if size > max_bytes:
                    raise too_large(what, max_bytes)
                out.write(chunk)
                digest.update(chunk)
                if on_chunk is not None:
                    on_chunk()
        # Content-Length counts the bytes on the wire, before any Content-Encoding
        # is undone; a compressed body is checked by its decoder instead.
        encoded = response.headers.get("content-encoding", "identity").lower() != "identity"
        if declared is not None and not encoded and declared != size:
            raise TransientError(f"download ended at {size} of {declared} bytes", kind="dropped")
        final = claim_name(partial, dest_dir, name)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return ResultFile(
        path=str(final.resolve()),
        name=final.name,
        size=size,
        content_type=content_type.split(";")[0].strip() or "application/octet-stream",
        sha256=digest.hexdigest(),
    )
