"""Result files get safe names."""

from __future__ import annotations

import pytest

from apirunner.client import result_file_name


@pytest.mark.parametrize(
    ("url", "disposition", "content_type", "expected"),
    [
        ("http://h/v1/videos/v1/content", 'attachment; filename="v1.mp4"', "video/mp4", "v1.mp4"),
        ("http://h/files/abc.png", None, "image/png", "abc.png"),
        ("http://h/v1/videos/v1/content", None, "video/mp4", "task1.mp4"),
        ("http://h/x", None, "application/weird", "task1.bin"),
        ("http://h/x", 'attachment; filename="../../etc/passwd"', "text/plain", "passwd"),
        ("http://h/x", 'attachment; filename="a b;c.txt"', "text/plain", "a_b_c.txt"),
        ("http://h/.hidden.png", None, "image/png", "hidden.png"),
        ("http://h/dir/", None, "image/png; charset=binary", "task1.png"),
    ],
)
def test_result_file_names(
    url: str, disposition: str | None, content_type: str, expected: str
) -> None:
    assert result_file_name(url, disposition, content_type, "task1") == expected
