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

from dispatcher.cli.output import err
from dispatcher.client import ApiError, Client, ServiceUnavailable, StaleToken
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
    from dispatcher.settings import Settings

    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})
    except Exception as exc:  # pydantic's ValidationError: say it plainly
        err.print(f"[red]invalid settings:[/red] {escape(str(exc))}")
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


def fail(message: str, code: int) -> NoReturn:
    err.print(f"[red]error:[/red] {escape(message)}")
    raise typer.Exit(code)


@contextmanager
def handled() -> Iterator[None]:
    """Turn the errors a command may meet into one clear line and an exit code."""
    try:
        yield
    except (ServiceUnavailable, StaleToken) as exc:
        fail(str(exc), EXIT_UNAVAILABLE)
    except (InputError, ConfigError) as exc:
        fail(str(exc), EXIT_USAGE)
    except ApiError as exc:
        fail(f"{exc} (HTTP {exc.status})", EXIT_FAILED)
    except DispatcherError as exc:
        fail(str(exc), EXIT_FAILED)


@contextmanager
def service_client() -> Iterator[Client]:
    with handled():
        client = Client(service_state_dir())
        try:
            yield client
        finally:
            client.close()
