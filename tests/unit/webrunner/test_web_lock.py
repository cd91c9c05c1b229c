"""The per-account filelock: named by a hash, exclusive, non-blocking, clear refusal."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

from dispatcher.errors import LockHeld
from webrunner.lock import AccountLock, lock_name, os_user


def test_the_lock_file_is_named_by_a_hash_of_user_and_account() -> None:
    expected = hashlib.sha256(f"{os_user()}\0demo-1".encode()).hexdigest()[:24]
    assert lock_name("demo-1") == f"web-{expected}.lock"
    assert lock_name("demo-1") != lock_name("demo-2")
    assert lock_name("demo-1", user="alice") != lock_name("demo-1", user="bob")
    assert "/" not in lock_name("../../etc/passwd")


def test_a_second_holder_is_refused_without_disturbing_the_first(tmp_path: Path) -> None:
    first = AccountLock(tmp_path, "demo-1")
    first.acquire()
    second = AccountLock(tmp_path, "demo-1")
    with pytest.raises(LockHeld) as caught:
        second.acquire()
    message = str(caught.value)
    assert "'demo-1'" in message
    assert "another dispatcher" in message
    assert "pid" in message  # who holds it
    assert first.held and not second.held

    other_account = AccountLock(tmp_path, "demo-2")
    other_account.acquire()  # a different account is independent

    first.release()
    second.acquire()  # free again once released
    second.release()
    other_account.release()


def test_another_process_is_refused_too(tmp_path: Path) -> None:
    lock = AccountLock(tmp_path, "demo-1")
    lock.acquire()
    try:
        code = (
            "import sys; from pathlib import Path\n"
            "from dispatcher.errors import LockHeld\n"
            "from webrunner.lock import AccountLock\n"
            "try:\n"
            f"    AccountLock(Path({str(tmp_path)!r}), 'demo-1').acquire()\n"
            "except LockHeld as exc:\n"
            "    print(exc); sys.exit(3)\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 3, done.stderr
        assert "another dispatcher" in done.stdout
    finally:
        lock.release()
