"""Where a setting's value came from, and settings errors an operator can act on.

pydantic names a field ("concurrency") and, for a value that is not even
JSON, neither the variable nor the value. Under systemd the operator edits
`DISPATCHER_CONCURRENCY=...` in an environment file, so every settings
error names the variable, the source that set it and its value (secrets
masked), and a reload can say which source won when several set one.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dotenv import dotenv_values
from pydantic import ValidationError
from pydantic_settings import SettingsError

from dispatcher.errors import ConfigError
from dispatcher.logs import MASK, scrub

if TYPE_CHECKING:
    from dispatcher.settings import Settings

ENV_PREFIX = "DISPATCHER_"
ENV_FILE = ".env"
TOML_FILE = "dispatcher.toml"
# A field whose name holds one of these words is a secret: never shown.
_SECRET_WORDS = ("secret", "key", "token", "password", "credential")
# A value shown in an error is cut here: an error line, not a dump.
MAX_SHOWN_CHARS = 200
_FIELD_IN_MESSAGE = re.compile(r'field "(\w+)"')
_URL_PASSWORD = re.compile(r"([A-Za-z][\w+.-]*://[^/\s:@]*:)[^/\s@]*@")
_URL_QUERY = re.compile(r"([A-Za-z][\w+.-]*://[^\s?\"']*)\?[^\s\"']*")


def env_name(field: str) -> str:
    return f"{ENV_PREFIX}{field.upper()}"


@dataclass(frozen=True)
class Found:
    source: str  # "the process environment", ".env (/path)", ...
    raw: Any  # the value as written there (text, or TOML's own types)


def where_set(
    field: str,
    overrides: Mapping[str, Any] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> list[Found]:
    """Every source that sets `field`, in the order pydantic ranks them (the first wins).

    Mirrors `Settings.settings_customise_sources`: options given to the
    command, the process environment, `.env`, then `dispatcher.toml`, both
    files read from the working directory as the settings model reads them.
    """
    found: list[Found] = []
    if overrides and overrides.get(field) is not None:
        found.append(Found("a command-line option", overrides[field]))
    name = env_name(field)
    environ = os.environ if environ is None else environ
    for key, value in environ.items():
        if key.upper() == name:
            found.append(Found("the process environment", value))
            break
    base = cwd or Path.cwd()
    env_file = base / ENV_FILE
    if env_file.is_file():
        for file_key, file_value in dotenv_values(env_file).items():
            if file_key.upper() == name and file_value is not None:
                found.append(Found(f"{ENV_FILE} ({env_file.resolve()})", file_value))
    toml_file = base / TOML_FILE
    if toml_file.is_file():
        try:
            data = tomllib.loads(toml_file.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
            data = {}
        if field in data:
            found.append(Found(f"{TOML_FILE} ({toml_file.resolve()})", data[field]))
    return found


def is_secret(field: str) -> bool:
    return any(word in field.lower() for word in _SECRET_WORDS)


def shown(field: str, raw: Any) -> str:
    """The value as an error may print it: secrets masked, long values cut."""
    if is_secret(field):
        return MASK
    text = raw if isinstance(raw, str) else repr(raw)
    text = scrub(_without_passwords(text))
    if len(text) > MAX_SHOWN_CHARS:
        text = text[:MAX_SHOWN_CHARS] + f"... ({len(text)} characters)"
    return repr(text)


def _without_passwords(text: str) -> str:
    """URLs' passwords and queries (where tokens live) masked."""
    text = _URL_PASSWORD.sub(rf"\1{MASK}@", text)
    return _URL_QUERY.sub(rf"\1?{MASK}", text)


def describe(
    exc: Exception, overrides: Mapping[str, Any] | None = None, *, cwd: Path | None = None
) -> str:
    """One line per bad setting: the variable, where it was set, its value, what is wrong."""
    problems: list[tuple[str, str]] = []
    if isinstance(exc, ValidationError):
        for error in exc.errors(include_url=False):
            field = str(error["loc"][0]) if error["loc"] else ""
            problems.append((field, str(error["msg"]).removeprefix("Value error, ")))
    else:
        match = _FIELD_IN_MESSAGE.search(str(exc))
        cause = exc.__cause__ or exc.__context__
        why = f"not valid JSON ({cause})" if cause is not None else str(exc)
        problems.append((match.group(1) if match else "", why))
    lines = [_problem_line(field, why, overrides, cwd) for field, why in problems]
    return "; ".join(lines)


def _problem_line(
    field: str, why: str, overrides: Mapping[str, Any] | None, cwd: Path | None
) -> str:
    if not field:
        return why
    found = where_set(field, overrides, cwd=cwd)
    if not found:
        return f"{env_name(field)}: {why}"
    first = found[0]
    hint = ""
    if isinstance(first.raw, str) and re.search(r"\s#", first.raw):
        hint = (
            " (an environment file keeps everything after '=': a '#' comment "
            "belongs on a line of its own)"
        )
    return f"{env_name(field)}={shown(field, first.raw)} (from {first.source}): {why}{hint}"


def load(overrides: Mapping[str, Any] | None = None) -> Settings:
    """The settings, or a ConfigError naming each bad variable and its value."""
    from dispatcher.settings import Settings

    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    try:
        return Settings(**given)
    except (ValidationError, SettingsError, ValueError) as exc:
        raise ConfigError(f"invalid settings: {describe(exc, given)}") from exc
