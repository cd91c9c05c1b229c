"""API keys (the variables profiles name in `auth_env`), read again without a restart.

Runners read a key from the process environment at every request. Under
systemd that environment is fixed at start; a local service also takes keys
from the `.env` of its working directory, the file its settings come from,
and reads it again on a reload and when an account is enabled, so a key
added there is used at once. A key in the process environment wins over
`.env`, as for settings.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from dotenv import dotenv_values

from dispatcher.errors import NotFound
from dispatcher.logs import redact
from dispatcher.settings_sources import ENV_FILE

if TYPE_CHECKING:
    from dispatcher.accounts.switches import AccountBook
    from dispatcher.profiles import Profile

# Keys this process put into its environment from `.env`: only these are
# replaced or removed when the file changes; the real environment is left alone.
_FROM_DOTENV: dict[str, str] = {}


def missing_key_reason(auth_env: str) -> str:
    return f"its key is missing: the environment variable {auth_env} is unset"


def reread_keys(names: Iterable[str], cwd: Path | None = None) -> list[str]:
    """Take the keys `names` from `.env` where the environment lacks them; the names changed."""
    env_file = (cwd or Path.cwd()) / ENV_FILE
    try:
        values = dotenv_values(env_file) if env_file.is_file() else {}
    except (OSError, UnicodeDecodeError):
        values = {}
    changed = []
    for name in sorted(set(names)):
        ours = _FROM_DOTENV.get(name)
        current = os.environ.get(name)
        if current and current != ours:
            continue  # set by whoever started the process: it wins
        value = values.get(name) or None
        if value == current:
            continue
        if value is None:
            os.environ.pop(name, None)
            _FROM_DOTENV.pop(name, None)
        else:
            redact(value)
            os.environ[name] = value
            _FROM_DOTENV[name] = value
        changed.append(name)
    return changed


async def check_keys(profiles: Iterable[Profile], accounts: AccountBook) -> None:
    """Keys read again (`.env` too). A provider whose key variable is unset
    cannot run a task: it needs attention and its tasks wait instead of
    failing; once the key is there it clears itself."""
    # A key, and for a signed token its secret too (`auth_secret_env`).
    keyed = {
        profile.provider: tuple(
            name for name in (profile.api.auth_env, profile.api.auth_secret_env) if name
        )
        for profile in profiles
        if profile.api is not None and profile.api.auth_env and profile.provider
    }
    await asyncio.to_thread(reread_keys, [name for names in keyed.values() for name in names])
    for provider, names in keyed.items():
        missing = [name for name in names if not os.environ.get(name)]
        try:
            account = accounts.get(provider)
        except NotFound:  # no lane for it here (another host's, or refused)
            continue
        if not missing:
            ours = {missing_key_reason(name) for name in names}
            if account.enabled and account.needs_attention and account.reason in ours:
                await accounts.enable(provider)
            continue
        reason = missing_key_reason(missing[0])
        if account.enabled and not (account.needs_attention and account.reason == reason):
            await accounts.needs_attention(provider, reason)
