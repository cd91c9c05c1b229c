"""A result file a vendor sends inline, as base64 inside its JSON answer.

Decoded off the event loop, bounded by the download limit, written as a
part file and renamed like a download (`dispatcher.fetch.claim_name`).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import secrets
from pathlib import Path

from dispatcher.errors import PermanentError
from dispatcher.fetch import claim_name, too_large
from dispatcher.scheduling.protocol import ResultFile

# The first bytes of the formats vendors send, and what to call the file.
_MAGIC: tuple[tuple[bytes, int, str, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", 0, "image/png", "png"),
    (b"\xff\xd8\xff", 0, "image/jpeg", "jpg"),
    (b"WEBP", 8, "image/webp", "webp"),
    (b"ftyp", 4, "video/mp4", "mp4"),
    (b"GIF8", 0, "image/gif", "gif"),
)


def sniff(data: bytes) -> tuple[str, str]:
    """(content type, extension) from the bytes themselves."""
    for magic, offset, content_type, ext in _MAGIC:
        if data[offset : offset + len(magic)] == magic:
            return content_type, ext
    return "application/octet-stream", "bin"


def decode(text: str, max_bytes: int) -> bytes:
    """The bytes of a base64 (or data: URL) value; permanent when it is not one
    or would be larger than `max_bytes`."""
    if text.startswith("data:"):
        text = text.partition(",")[2]
    # 4 characters carry 3 bytes: refuse before decoding what would not fit.
    if len(text) // 4 * 3 > max_bytes + 3:
        raise too_large("the inline result", max_bytes)
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise PermanentError(f"the inline result is not base64: {exc}", kind="bad_answer") from exc
    if len(data) > max_bytes:
        raise too_large("the inline result", max_bytes)
    return data


def _write(data: bytes, dest_dir: Path, stem: str) -> ResultFile:
    content_type, ext = sniff(data)
    dest_dir.mkdir(parents=True, exist_ok=True)
    partial = dest_dir / f".{stem}.{secrets.token_hex(4)}.part"
    try:
        partial.write_bytes(data)
        final = claim_name(partial, dest_dir, f"{stem}.{ext}")
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return ResultFile(
        path=str(final.resolve()),
        name=final.name,
        size=len(data),
        content_type=content_type,
        sha256=hashlib.sha256(data).hexdigest(),
    )


async def save_inline(text: str, dest_dir: Path, stem: str, max_bytes: int) -> ResultFile:
    data = await asyncio.to_thread(decode, text, max_bytes)
    return await asyncio.to_thread(_write, data, dest_dir, stem)
