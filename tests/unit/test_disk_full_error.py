"""`disk_full_error`: a full disk behind an attempt's failure, however wrapped."""

from __future__ import annotations

import errno
from pathlib import Path

from dispatcher.errors import PermanentError, TransientError
from dispatcher.scheduling.running import disk_full_error

WHERE = Path("/state/results/t1/attempt-1")


def wrapped(inner: BaseException) -> TransientError:
    try:
        try:
            raise inner
        except OSError as exc:
            raise RuntimeError("download failed") from exc
    except RuntimeError as exc:
        try:
            raise TransientError("dropped", kind="dropped") from exc
        except TransientError as outer:
            return outer


def test_a_full_disk_is_found_through_wrappers_and_named_with_its_path() -> None:
    error = disk_full_error(wrapped(OSError(errno.ENOSPC, "No space left on device")), WHERE)
    assert isinstance(error, PermanentError) and not error.retryable
    assert error.kind == "disk_full"
    assert str(WHERE) in error.message and "No space left on device" in error.message


def test_the_file_name_of_the_error_is_named_when_known() -> None:
    full = OSError(errno.EDQUOT, "Disk quota exceeded", "/state/results/t1/a.mp4")
    error = disk_full_error(full, WHERE)
    assert error is not None and "/state/results/t1/a.mp4" in error.message


def test_other_failures_are_left_alone() -> None:
    assert disk_full_error(wrapped(OSError(errno.EACCES, "Permission denied")), WHERE) is None
    assert disk_full_error(TransientError("HTTP 503"), WHERE) is None
