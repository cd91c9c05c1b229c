"""The demo API provider's media: small, deterministic stand-ins for videos and images."""

from __future__ import annotations

import hashlib
import struct
import zlib


def _box(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", 8 + len(payload)) + kind + payload


def _stream(seed: str, size: int) -> bytes:
    out = bytearray()
    counter = 0
    while len(out) < size:
        out += hashlib.sha256(f"{seed}:{counter}".encode()).digest()
        counter += 1
    return bytes(out[:size])


def video_bytes(prompt: str, size: int = 16 * 1024) -> bytes:
    """A small, deterministic stand-in for an MP4 (ftyp + mdat boxes)."""
    ftyp = _box(b"ftyp", b"isom\x00\x00\x02\x00isomiso2mp41")
    return ftyp + _box(b"mdat", _stream(prompt, size - len(ftyp) - 8))


def png_bytes(prompt: str, side: int = 64) -> bytes:
    """A real, deterministic PNG whose colours come from the prompt."""
    r, g, b = hashlib.sha256(prompt.encode()).digest()[:3]
    rows = b"".join(
        b"\x00" + b"".join(bytes((r, (g + 3 * y) % 256, (b + 3 * x) % 256)) for x in range(side))
        for y in range(side)
    )

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = struct.pack(">I", zlib.crc32(kind + data))
        return struct.pack(">I", len(data)) + kind + data + crc

    header = struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )
