"""Reference images that are small on the wire and huge in memory (issue 25 #5).

The service runs in this process, so its memory is this process's: RSS from
psutil, the peak from the kernel's high-water mark (reset before each run).
"""

from __future__ import annotations

import asyncio
import base64
import gc
import re
import struct
import zlib
from pathlib import Path
from typing import Any

import psutil

from dispatcher.tasks.decodebudget import GATE, MAX_DECODE_BYTES
from tests.support.harness import running_service


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def _flat_png(width: int, height: int, shade: int) -> bytes:
    """A one-colour RGB PNG, built row by row: a few hundred KB for ~200 MB of pixels."""
    packer = zlib.compressobj(9)
    row = b"\x00" + bytes([shade]) * (width * 3)  # filter byte, then the pixels
    data = b"".join(packer.compress(row) for _ in range(height)) + packer.flush()
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", header)
        + _chunk(b"IDAT", data)
        + _chunk(b"IEND", b"")
    )


def _data_url(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def _task(ref: str, prompt: str) -> dict[str, Any]:
    return {"model": "demo-chat-api", "params": {"prompt": prompt, "reference_image": ref}}


def _rss() -> int:
    gc.collect()
    return int(psutil.Process().memory_info().rss)


def _reset_peak() -> None:
    # Linux: "5" resets this process's VmHWM (peak resident set) to its RSS now.
    Path("/proc/self/clear_refs").write_text("5")


def _peak() -> int:
    found = re.search(r"VmHWM:\s+(\d+) kB", Path("/proc/self/status").read_text())
    assert found is not None
    return int(found.group(1)) * 1024


async def test_a_decode_over_the_budget_is_refused_naming_it(tmp_path: Path) -> None:
    # 7,990 x 7,990 is under the 64 MP cap; its RGB pixels are 191 MB.
    bomb = _data_url(_flat_png(7990, 7990, 40))
    assert len(bomb) < 400_000
    async with running_service(tmp_path) as h:
        before = _rss()
        _reset_peak()
        response = await h.http.post("/v1/tasks", json=_task(bomb, "a bomb"))
        grown = _peak() - before
        assert response.status_code == 400, response.text
        message = response.json()["error"]["message"]
        assert "reference_image" in message and "7990x7990" in message
        assert f"decode budget is {MAX_DECODE_BYTES:,} bytes" in message
        assert await h.service.store.state_counts() == {}
        # Refused from the header: nothing was decoded.
        assert grown < 7990 * 7990, f"peak RSS grew {grown >> 20} MiB"


async def test_large_decodes_run_one_at_a_time_and_give_their_memory_back(
    tmp_path: Path,
) -> None:
    side = 5500  # 91 MB of RGB pixels: under the budget, two do not fit it at once
    pictures = [_data_url(_flat_png(side, side, shade)) for shade in (10, 60, 110, 160)]
    one = side * side * 3
    assert one <= MAX_DECODE_BYTES < 2 * one
    async with running_service(tmp_path) as h:
        before = _rss()
        _reset_peak()
        answers = await asyncio.gather(
            *(
                # One at a time on a busy machine: the last waits for three.
                h.http.post("/v1/tasks", json=_task(ref, f"picture {i}"), timeout=100)
                for i, ref in enumerate(pictures)
            )
        )
        assert [a.status_code for a in answers] == [201] * 4, [a.text for a in answers]
        done = [await h.wait_task(a.json()["id"]) for a in answers]
        grown = _peak() - before
        held = _rss() - before
    assert [t["state"] for t in done] == ["success"] * 4
    assert GATE.largest <= MAX_DECODE_BYTES
    # Four decodes at once took 4 x 2-3 copies of the pixels (over 1.5 GB);
    # one at a time, the peak is one decode's copies.
    assert grown < 4 * one, f"peak RSS grew {grown >> 20} MiB (one picture: {one >> 20} MiB)"
    # Given back: the service does not stay at its peak.
    assert held < one, f"RSS stayed {held >> 20} MiB above the start"
