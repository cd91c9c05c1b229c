"""The state dir: its port, token and lock files, and its files private to this user.

The state dir holds prompts, results, the database and the token; nothing
the service writes there may be readable by another user, not even for the
moment between creating a file and tightening it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import tempfile
from pathlib import Path

import httpx

from dispatcher.errors import ConfigError

log = logging.getLogger("dispatcher.service")

PORT_FILE = "port"
TOKEN_FILE = "token"
LOCK_FILE = "service.lock"


def read_state_file(state_dir: Path, name: str) -> str | None:
    try:
        return (state_dir / name).read_text().strip()
    except OSError:
        return None


async def probe_running(state_dir: Path) -> int | None:
    """The port of a dispatcher still answering for this state dir, if any."""
    port = read_state_file(state_dir, PORT_FILE)
    if not port or not port.isdigit():
        return None
    try:
        async with httpx.AsyncClient(timeout=1.0) as client:
            response = await client.get(f"http://127.0.0.1:{port}/healthz")
    except httpx.HTTPError:
        return None
    return (
        int(port) if response.headers.get("x-dispatcher") or response.status_code == 200 else None
    )


def write_private(path: Path, text: str) -> None:
    """Write a file only its owner can read, without a window where others could.

    The temporary file gets a fresh random name, created exclusively: a
    `token.tmp` (or any name) planted beforehand, say a symlink to a file of
    ours, is never opened, so nothing is written or truncated through it.
    The rename then replaces a planted `path` symlink itself, not its target.
    """
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def sqlite_files(url: str) -> list[Path]:
    """The database file and its WAL companions, for a SQLite URL."""
    if not url.startswith("sqlite:///"):
        return []
    main = Path(url.removeprefix("sqlite:///"))
    return [main, main.with_name(main.name + "-wal"), main.with_name(main.name + "-shm")]


def make_private_dir(path: Path, what: str) -> None:
    """Create `path` 0700, or tighten it to 0700; refuse one another user owns.

    Another user's dir cannot be made private by us (they can always chmod
    it back), so the service refuses it rather than writing prompts there.
    """
    with contextlib.suppress(FileNotFoundError):
        link = path.lstat()
        # A link of our own is the operator's choice; another user's was
        # planted, and following it would chmod (and fill) whatever it names.
        if stat.S_ISLNK(link.st_mode) and link.st_uid != os.getuid():
            raise ConfigError(
                f"{what} {path} is a symlink (to {os.readlink(path)!r}) owned by uid "
                f"{link.st_uid}, not by this user (uid {os.getuid()}); remove it"
            )
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    info = path.stat()
    if info.st_uid != os.getuid():
        raise ConfigError(
            f"{what} {path} is owned by uid {info.st_uid}, not by this user (uid "
            f"{os.getuid()}); it holds prompts, results and the token, so it must be "
            "this user's own: use another DISPATCHER_STATE_DIR or chown it"
        )
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o077:
        os.chmod(path, 0o700)
        log.warning("%s %s was mode %o; tightened to 700", what, path, mode)


def refuse_symlinks(paths: list[Path], what: str) -> None:
    """Refuse to start on a symlink where the service opens or chmods a file of its own.

    The service runs with its user's rights (often root): a link planted
    while the state dir was open to others would make it open, truncate or
    chmod whatever the link names.
    """
    for path in paths:
        try:
            info = path.lstat()
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise ConfigError(f"cannot inspect {what} {path}: {exc.strerror}") from exc
        if stat.S_ISLNK(info.st_mode):
            raise ConfigError(
                f"{what} {path} is a symlink (to {os.readlink(path)!r}); the service will not "
                "open or chmod a file through a link someone may have planted: remove it, or "
                "point the setting at the real file"
            )
        if info.st_uid != os.getuid():
            raise ConfigError(
                f"{what} {path} is owned by uid {info.st_uid}, not by this user (uid "
                f"{os.getuid()}); remove it or chown it"
            )


def create_private_file(path: Path | None) -> None:
    """An empty file at `path`, mode 0600, unless something is there already
    (SQLite takes an empty file for a new database)."""
    if path is None:
        return
    try:
        fd = os.open(
            path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
        )
    except FileExistsError:
        return
    except OSError as exc:
        raise ConfigError(f"cannot create the database file {path}: {exc.strerror}") from exc
    os.close(fd)


def make_private_files(paths: list[Path]) -> None:
    for path in paths:
        # O_NOFOLLOW: a link swapped in since `refuse_symlinks` is not followed
        # (the open fails with ELOOP) and its target's mode stays as it was.
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise ConfigError(f"cannot open {path} to make it private: {exc.strerror}") from exc
        try:
            if stat.S_IMODE(os.fstat(fd).st_mode) != 0o600:
                os.fchmod(fd, 0o600)
        finally:
            os.close(fd)
