"""Where each web account's browser profile lives, and which names may name one."""

from __future__ import annotations

import re
from pathlib import Path

from dispatcher.errors import InputError

# An account name becomes a directory name; keep it boring.
_ACCOUNT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def check_account_name(account: str, where: str = "") -> None:
    """InputError unless `account` can name a directory safely."""
    if not _ACCOUNT_NAME.match(account):
        raise InputError(
            f"{where}web account name {account!r} must be 1-64 letters, digits, '.', '_' "
            "or '-', starting with a letter or digit (it names a directory)"
        )


def browser_profiles_dir(state_dir: Path) -> Path:
    return state_dir / "browser"


def user_data_dir_for(state_dir: Path, account: str) -> Path:
    """Where an account's browser profile (its logged-in session) lives."""
    return browser_profiles_dir(state_dir) / account
