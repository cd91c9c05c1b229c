"""Reaching the running service: settings, the state dir, the client, exit codes.

Errors a command may meet become one clear line on stderr and an exit code.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import typer
from rich.markup import escape

from dispatcher.cli.output import err, print_json
from dispatcher.cli.service_client import ApiError, Client, ServiceUnavailable, StaleToken
from dispatcher.errors import ConfigError, DispatcherError, InputError

if TYPE_CHECKING:
    from dispatcher.settings import Settings

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 3
EXIT_INTERRUPTED = 130

# Global options, set by the root callback before any command runs.
options: dict[str, Any] = {}


def load_settings(**overrides: Any) -> Settings:
    from dispatcher.settings_sources import load

    try:
        return load(overrides)
    except ConfigError as exc:  # names the variable, its source and value
        err.print(f"[red]error:[/red] {escape(str(exc))}")
        raise typer.Exit(EXIT_USAGE) from exc


def service_state_dir() -> Path:
    """Where the running service keeps its port and token files."""
    if options.get("state_dir"):
        return Path(options["state_dir"])
    # The environment outranks .env and dispatcher.toml: no need to load settings.
    from_env = os.environ.get("DISPATCHER_STATE_DIR")
    if from_env:
        return Path(from_env)
    return load_settings().state_dir


# Error kinds in `--json` output, by exit code, when the service named none.
_KINDS = {EXIT_FAILED: "failed", EXIT_USAGE: "invalid", EXIT_UNAVAILABLE: "unavailable"}


def report(message: str, code: int, kind: str | None = None) -> None:
    """One clear line on stderr, or with --json an error object on stdout."""
    if options.get("json"):
        print_json({"error": {"kind": kind or _KINDS.get(code, "failed"), "message": message}})
    else:
        err.print(f"[red]error:[/red] {escape(message)}")


def fail(message: str, code: int, kind: str | None = None) -> NoReturn:
    report(message, code, kind)
    raise typer.Exit(code)


def api_exit_code(exc: ApiError) -> int:
    """Bad input (a malformed request, an unknown id or model) is 2, as everywhere."""
    if exc.status in (400, 404) or exc.kind == "ambiguous":
        return EXIT_USAGE
    return EXIT_FAILED


@contextmanager
def handled(as_json: bool | None = None) -> Iterator[None]:
    """Turn the errors a command may meet into one clear line and an exit code."""
    if as_json is not None:
        options["json"] = as_json
    try:
        yield
    except StaleToken as exc:
        fail(str(exc), EXIT_UNAVAILABLE, "stale_token")
    except ServiceUnavailable as exc:
        fail(str(exc), EXIT_UNAVAILABLE, "unavailable")
    except ConfigError as exc:
        fail(str(exc), EXIT_USAGE, "config")
    except InputError as exc:
        fail(str(exc), EXIT_USAGE, "invalid")
    except ApiError as exc:
        fail(f"{exc} (HTTP {exc.status})", api_exit_code(exc), exc.kind)
    except DispatcherError as exc:
        fail(str(exc), EXIT_FAILED, "failed")


@contextmanager
def service_client(as_json: bool | None = None) -> Iterator[Client]:
    with handled(as_json):
        client = Client(service_state_dir())
        try:
            yield client
        finally:
            client.close()
