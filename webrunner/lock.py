"""One filelock per web account, held for the lane's lifetime.

A logged-in session can run one generation at a time, and a browser profile
(user-data dir) can be opened by one Chromium at a time. Two dispatchers on
the same machine and state dir driving the same account would break both, so
the second one must refuse at start-up instead of fighting over the profile.
"""

from __future__ import annotations

import contextlib
import getpass
import hashlib
import json
import os
import socket
import time
from pathlib import Path

import filelock

from dispatcher.errors import LockHeld


def os_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        # No passwd entry (some containers): the uid still tells users apart.
        return str(os.getuid())


def lock_name(account: str, user: str | None = None) -> str:
    """The lock file name: a hash, so odd account names never reach the filesystem."""
    digest = hashlib.sha256(f"{user or os_user()}\0{account}".encode()).hexdigest()
    return f"web-{digest[:24]}.lock"


class AccountLock:
    """A non-blocking, process-exclusive lock on one web account."""

    def __init__(self, locks_dir: Path, account: str) -> None:
        self.account = account
        self.path = locks_dir / lock_name(account)
        # Who holds it, for the refusal message; the lock file itself is
        # owned by filelock and must stay empty.
        self.owner_path = self.path.with_suffix(".owner.json")
        self._lock = filelock.FileLock(self.path, timeout=0, thread_local=False)

    @property
    def held(self) -> bool:
        return self._lock.is_locked

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            self._lock.acquire(timeout=0)
        except filelock.Timeout as exc:
            raise LockHeld(
                f"web account {self.account!r} is held by another dispatcher"
                f"{self._describe_owner()} (lock file {self.path}); stop that "
                "dispatcher, or give this one a different state dir or account list"
            ) from exc
        with contextlib.suppress(OSError):
            self.owner_path.write_text(
                json.dumps(
                    {
                        "account": self.account,
                        "pid": os.getpid(),
                        "host": socket.gethostname(),
                        "since": time.time(),
                    }
                ),
                encoding="utf-8",
            )

    def release(self) -> None:
        if not self._lock.is_locked:
            return
        with contextlib.suppress(OSError):
            self.owner_path.unlink()
        self._lock.release(force=True)

    def _describe_owner(self) -> str:
        try:
            owner = json.loads(self.owner_path.read_text(encoding="utf-8"))
            return f" (pid {int(owner['pid'])} on {owner['host']})"
        except (OSError, ValueError, KeyError, TypeError):
            return ""
