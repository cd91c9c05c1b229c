"""Saving the media an answer shows: data: and blob: URLs, and downloads.

Downloads go through the one fetch path (`dispatcher.fetch`), each hop
checked against the allowlist, within the phase's budget, through the run's
guard (`page_step`), so a cancel or the deadline ends them too.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import mimetypes
from collections.abc import Awaitable
from pathlib import Path
from typing import TypeVar
from urllib.parse import unquote

import httpx

from dispatcher import fetch
from dispatcher.errors import PermanentError, TransientError
from dispatcher.fetch import HostCheck
from dispatcher.models import Stage
from dispatcher.scheduling.protocol import ResultFile
from webrunner.page import PageDriver
from webrunner.pagestep import Budget, first_line, page_step

T = TypeVar("T")

# None when the blob is larger than the cap: it never crosses to Python.
_BLOB_JS = """async ([url, maxBytes]) => {
    const blob = await (await fetch(url)).blob();
    if (blob.size > maxBytes) return null;
    const buf = new Uint8Array(await blob.arrayBuffer());
    let s = '';
    for (let i = 0; i < buf.length; i += 0x8000)
        s += String.fromCharCode.apply(null, buf.subarray(i, i + 0x8000));
    return btoa(s);
}"""


async def _call(driver: PageDriver, aw: Awaitable[T], what: str) -> T:
    return await page_step(driver.ctx, aw, what=what, budget=driver.budget)


async def download_media(
    driver: PageDriver,
    urls: list[str],
    result_dir: Path,
    *,
    allowlist: HostCheck,
    max_bytes: int,
) -> list[ResultFile]:
    """Fetch the media the answer shows, through the one fetch path.

    Every hop is checked against the allowlist (a page is untrusted: it
    may point at any host, or redirect there). The site's cookies and
    the full Referer go to the page's own origin only, host and port.
    """
    if not urls:
        return []
    await driver.ctx.set_stage(Stage.DOWNLOADING, 0.0)
    _make_dir(result_dir)
    files: list[ResultFile] = []
    page_url = driver.page.url
    cookies = await _call(
        driver, driver.page.context.cookies([page_url]), "reading the page's cookies"
    )
    user_agent = await _call(
        driver, driver.page.evaluate("navigator.userAgent"), "reading the user agent"
    )
    page = httpx.URL(page_url)
    credentials = {"Referer": page_url}
    cookie_header = "; ".join(
        f"{c['name']}={c['value']}" for c in cookies if c.get("name") and "value" in c
    )
    if cookie_header:
        credentials["Cookie"] = cookie_header
    # Elsewhere only the page's origin, as a browser's default policy sends.
    headers = {"User-Agent": user_agent, "Referer": f"{page.scheme}://{page.netloc.decode()}/"}
    client = fetch.without_cookie_jar(
        httpx.AsyncClient(timeout=httpx.Timeout(60.0), follow_redirects=False)
    )
    async with client:
        for index, url in enumerate(urls):
            driver.ctx.check_canceled()
            prefix = f"{index:02d}-"
            if url.startswith("data:"):
                target = result_dir / f"{prefix}media-{index}"
                files.append(_save_data_url(url, target, max_bytes))
            elif url.startswith("blob:"):
                b64 = await _call(
                    driver, driver.page.evaluate(_BLOB_JS, [url, max_bytes]), "reading a blob"
                )
                if b64 is None:
                    raise fetch.too_large(f"the media blob {index}", max_bytes)
                target = result_dir / f"{prefix}media-{index}"
                files.append(_save_bytes(base64.b64decode(b64), target, None))
            else:
                out = fetch.Outbound(
                    "GET",
                    url,
                    headers=headers,
                    credentials=credentials,
                    credentials_origin=fetch.origin_of(page),
                )
                files.append(
                    await _download(driver, client, allowlist, out, result_dir, index, max_bytes)
                )
            await driver.ctx.set_stage(Stage.DOWNLOADING, (index + 1) / len(urls))
    return files


async def _download(
    driver: PageDriver,
    client: httpx.AsyncClient,
    allowlist: HostCheck,
    out: fetch.Outbound,
    result_dir: Path,
    index: int,
    max_bytes: int,
) -> ResultFile:
    # The fetch's own deadline is the phase's budget and ends it with a
    # permanent error; the guard gets a second more, as a backstop only.
    remaining_s = driver.budget.remaining(driver.ctx.clock)
    backstop = Budget(driver.budget.deadline + 1.0, driver.budget.label)
    return await page_step(
        driver.ctx,
        _stream(driver, client, allowlist, out, result_dir, index, max_bytes, remaining_s),
        what=f"downloading {out.url}",
        budget=backstop,
        alive=True,
    )


async def _stream(
    driver: PageDriver,
    client: httpx.AsyncClient,
    allowlist: HostCheck,
    out: fetch.Outbound,
    result_dir: Path,
    index: int,
    max_bytes: int,
    deadline_s: float,
) -> ResultFile:
    url = str(out.url)
    try:
        async with (
            fetch.deadline(deadline_s, f"downloading {url}", driver.budget.label),
            fetch.open_stream(client, allowlist, out) as response,
        ):
            status = response.status_code
            if status >= 300:
                retryable = status >= 500 or status in (408, 429)
                error = TransientError if retryable else PermanentError
                raise error(f"downloading {url}: HTTP {status}", kind=f"http_{status}")
            return await fetch.save_stream(
                response,
                result_dir,
                stem=f"media-{index}",
                max_bytes=max_bytes,
                prefix=f"{index:02d}-",
                on_chunk=driver.ctx.beat,
            )
    except httpx.HTTPError as exc:
        raise TransientError(f"downloading {url}: {first_line(exc)}", kind="download") from exc


def _content_type(header: str | None, target: Path) -> str:
    if header:
        return header.split(";")[0].strip() or "application/octet-stream"
    guessed, _ = mimetypes.guess_type(target.name)
    return guessed or "application/octet-stream"


def _make_dir(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)


def _result_file(target: Path, size: int, content_type: str | None, sha256: str) -> ResultFile:
    return ResultFile(
        path=str(target.resolve()),
        name=target.name,
        size=size,
        content_type=_content_type(content_type, target),
        sha256=sha256,
    )


def _save_bytes(data: bytes, target: Path, content_type: str | None) -> ResultFile:
    target.write_bytes(data)
    return _result_file(target, len(data), content_type, hashlib.sha256(data).hexdigest())


def _save_data_url(url: str, target: Path, max_bytes: int) -> ResultFile:
    header, _, payload = url.partition(",")
    if len(payload) // 4 * 3 > max_bytes:  # the decoded size, at least
        raise fetch.too_large("a media data: URL", max_bytes)
    meta = header[len("data:") :]
    content_type = meta.split(";")[0] or "text/plain"
    try:
        data = base64.b64decode(payload) if meta.endswith(";base64") else unquote(payload).encode()
    except (binascii.Error, ValueError) as exc:
        raise PermanentError("a media result is a malformed data: URL", kind="download") from exc
    if len(data) > max_bytes:
        raise fetch.too_large("a media data: URL", max_bytes)
    return _save_bytes(data, target, content_type)
