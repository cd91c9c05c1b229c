"""Local reference images: only under the input dirs, capped, one answer for the rest."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest
from PIL import Image

from dispatcher.errors import InputError
from dispatcher.tasks.fingerprint import LocalFiles, image_hash


def _png() -> bytes:
    out = io.BytesIO()
    with Image.new("RGB", (4, 4), "purple") as img:
        img.save(out, "PNG")
    return out.getvalue()


@pytest.fixture
def files(tmp_path: Path) -> LocalFiles:
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    (inputs / "ok.png").write_bytes(_png())
    (inputs / "notes.txt").write_text("not a picture")
    outside = tmp_path / "outside.png"
    outside.write_bytes(_png())
    (inputs / "out.png").symlink_to(outside)
    (inputs / "loop.png").symlink_to(inputs / "loop.png")
    (inputs / "dir.png").mkdir()
    os.mkfifo(inputs / "pipe.png")
    return LocalFiles.under([inputs], max_bytes=len(_png()))


def _message(ref: str, files: LocalFiles) -> str:
    with pytest.raises(InputError) as caught:
        image_hash(ref, files=files)
    return str(caught.value)


def test_everything_not_allowed_or_not_there_reads_the_same(
    tmp_path: Path, files: LocalFiles
) -> None:
    inputs = files.dirs[0]
    refs = [
        str(tmp_path / "outside.png"),
        "/etc/passwd",
        "/etc/no-such-file",
        str(inputs / "out.png"),
        "out.png",
        "loop.png",
        "dir.png",
        "pipe.png",
        "missing.png",
        "../outside.png",
        f"file://{tmp_path}/outside.png",
        "file:///etc/passwd",
        "bad\x00name.png",
    ]
    messages = {_message(ref, files) for ref in refs}
    assert len(messages) == 1, messages
    assert "input dirs" in messages.pop()


def test_allowed_files_by_name_path_or_url(files: LocalFiles) -> None:
    inputs = files.dirs[0]
    expected = image_hash(_png())
    for ref in ("ok.png", str(inputs / "ok.png"), f"file://{inputs}/ok.png", "./ok.png"):
        assert image_hash(ref, files=files) == expected
    assert "not an image" in _message("notes.txt", files)  # inside the dirs: say why


def test_size_is_checked_before_reading(files: LocalFiles) -> None:
    big = files.dirs[0] / "big.png"
    big.write_bytes(_png() + b"\0")
    assert "at most" in _message("big.png", files)


def test_without_input_dirs_no_local_file_is_read(tmp_path: Path) -> None:
    picture = tmp_path / "p.png"
    picture.write_bytes(_png())
    with pytest.raises(InputError, match="input dirs"):
        image_hash(str(picture))
