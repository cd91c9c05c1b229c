"""Files an operator names on the command line (a batch file, a session file).

Only regular files are read, and never more than a stated number of bytes:
a FIFO would block the command forever, a device such as ``/dev/zero``
never ends, and a huge file would be read whole into memory before any
check. The FIFO is opened non-blocking so that even the open cannot hang.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from dispatcher.errors import InputError

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)
_READ_CHUNK_BYTES = 1024 * 1024


def size_text(size_bytes: int) -> str:
    """`16 MiB` for whole mebibytes, bytes otherwise."""
    mib = 1024 * 1024
    if size_bytes % mib == 0:
        return f"{size_bytes // mib} MiB"
    return f"{size_bytes:,} bytes"


def read_regular_file(path: Path, max_bytes: int, what: str) -> bytes:
    """The bytes of `path`, a regular file of at most `max_bytes`.

    Anything else is an `InputError` naming the file: not there, not a
    regular file, or larger than `max_bytes`, the last also naming the line
    the limit falls on (so the operator sees where to split it). `what` names
    the file's role in messages ("a batch file").
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror}") from exc
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = next((name for test, name in _KINDS if test(mode)), "something else")
        raise InputError(f"{path}: {kind}, not a regular file; {what} must be a file")
    with os.fdopen(fd, "rb", buffering=0) as handle:
        chunks: list[bytes] = []
        received = 0
        try:
            # One byte past the limit tells "exactly the limit" from "over it"
            # even for a file that grows while it is read.
            while received <= max_bytes:
                chunk = handle.read(min(_READ_CHUNK_BYTES, max_bytes + 1 - received))
                if not chunk:
                    break
                chunks.append(chunk)
                received += len(chunk)
        except OSError as exc:
            raise InputError(f"cannot read {path}: {exc.strerror}") from exc
    raw = b"".join(chunks)
    if received > max_bytes:
        line = raw.count(b"\n", 0, max_bytes) + 1
        raise InputError(
            f"{path}:{line}: the file passes {size_text(max_bytes)} on this line, "
            f"the most {what} may hold"
        )
    return raw
