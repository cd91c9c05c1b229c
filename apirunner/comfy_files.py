"""The ComfyUI style's files: how an uploaded reference image is named, and
the one download path of its results."""

from __future__ import annotations

from functools import partial
from pathlib import Path

from apirunner.client import Call, ProviderClient, with_retries
from apirunner.polling import Rand
from dispatcher.clock import Clock
from dispatcher.scheduling.protocol import ResultFile


def image_suffix(data: bytes) -> str:
    # ComfyUI opens any format Pillow knows; the suffix only helps a human.
    if data.startswith(b"\xff\xd8"):
        return ".jpg"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return ".webp"
    return ".png"


async def fetch_file(
    client: ProviderClient,
    call: Call,
    dest_dir: Path,
    clock: Clock,
    rand: Rand,
    *,
    stem: str,
    max_bytes: int,
) -> ResultFile:
    """The one place this style downloads a result file (the shared download
    path, allowlisted and streamed, retried in place)."""
    return await with_retries(
        partial(client.download, call, dest_dir, stem, max_bytes=max_bytes),
        clock=clock,
        rand=rand,
    )
