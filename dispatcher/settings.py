"""Settings from `DISPATCHER_*` environment variables, `.env` or `dispatcher.toml`."""

from __future__ import annotations

import json
import os
import shutil
import socket
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from dispatcher.artifacts import Retention
from dispatcher.errors import ConfigError
from dispatcher.pricing import parse_budgets

BUNDLED_PROFILES_DIR = Path(__file__).resolve().parent.parent / "profiles"

DEFAULT_PROVIDER_CONCURRENCY = 3
MIN_PROVIDER_CONCURRENCY = 1
MAX_PROVIDER_CONCURRENCY = 5

_BROWSER_CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "chrome")


def default_state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "dispatcher"


def find_browser() -> str | None:
    """A Chromium on this machine: PATH first, then Playwright's own download."""
    for name in _BROWSER_CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    cache = Path(os.environ.get("PLAYWRIGHT_BROWSERS_PATH") or Path.home() / ".cache/ms-playwright")
    for candidate in sorted(cache.glob("chromium-*/chrome-linux*/chrome"), reverse=True):
        if candidate.is_file():
            return str(candidate)
    return None


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="DISPATCHER_",
        env_file=".env",
        env_file_encoding="utf-8",
        extra="ignore",
        toml_file="dispatcher.toml",
    )

    state_dir: Path = Field(default_factory=default_state_dir)
    database_url: str | None = None  # default: SQLite in the state dir
    # This machine's name among the hosts sharing one PostgreSQL database.
    host_id: str = Field(default_factory=socket.gethostname, min_length=1, max_length=200)
    # One directory mounted at this same path on every host sharing the
    # database: each host writes its results there and serves any host's.
    # Unset, results stay in <state dir>/results and only their host serves them.
    shared_results_dir: Path | None = None
    profiles_dir: Path = BUNDLED_PROFILES_DIR
    port: int | None = None  # default: a free one in 49152-65535
    browser_executable: str | None = None  # default: a Chromium found on the machine
    headless: bool = True
    # Real seconds a web account's browser stays open after a task, so the
    # next task skips the launch (~2-7 s); 0 closes it after every task.
    browser_keep_alive_s: float = Field(default=60.0, ge=0)
    # Start each web account's browser (on its model's page, logged-in
    # check done) when its lane opens, in the background, so its first task
    # skips the start; closed after `browser_keep_alive_s` without a task.
    browser_prewarm: bool = True
    concurrency: dict[str, int] = Field(default_factory=dict)  # per API provider
    # Dollars each API provider may spend per day (00:00 to 00:00 UTC):
    # "acme-video=50, demo=12.5" (or a JSON object); over a profile's [budget].
    budgets: Annotated[dict[str, float], NoDecode] = Field(default_factory=dict)
    default_concurrency: int = DEFAULT_PROVIDER_CONCURRENCY
    cache_max_bytes: int = 2 * 1024**3
    cache_ttl_s: float = 7 * 24 * 3600.0
    # What failed attempts leave for a person to look at (screenshots, HTML,
    # traces, the vendor's last answer): the oldest attempts' go first.
    artifacts_max_bytes: int = Field(default=256 * 1024**2, ge=0)
    artifacts_max_count: int = Field(default=200, ge=1)
    time_scale: float = Field(default=1.0, gt=0)
    http_timeout_s: float = 30.0
    # Bounds on what a vendor or a page may send us (per profile:
    # `max_download_bytes` in [api] or [web] overrides the first).
    max_download_bytes: int = Field(default=2 * 1024**3, gt=0)
    max_json_bytes: int = Field(default=16 * 1024**2, gt=0)
    retry_delay_s: float = 5.0
    # Failures of one class in a row on one web account or provider that take
    # it out of service (needs attention, with the class as the reason).
    account_failures_for_attention: int = Field(default=3, ge=1)
    log_format: Literal["text", "json"] = "text"
    # The service's event loop and HTTP/1.1 parser: auto = uvloop and
    # httptools (uvicorn's production pair) when installed, else asyncio's
    # loop and h11. Either can be pinned to the standard one should a
    # platform misbehave (see dispatcher/eventloop.py, dispatcher/serving.py).
    event_loop: Literal["auto", "uvloop", "asyncio"] = "auto"
    http_parser: Literal["auto", "httptools", "h11"] = "auto"
    log_level: str = "INFO"
    demo: bool = False
    # Endpoints told when a job finishes or an account changes state (comma- or
    # space-separated, or a JSON list); every POST is signed with the secret.
    webhook_urls: Annotated[list[str], NoDecode] = Field(default_factory=list)
    webhook_secret: str | None = None
    # Real seconds one webhook POST may take in all (a receiver dripping its
    # answer is cut off here, not after each read's timeout).
    webhook_deadline_s: float = Field(default=10.0, gt=0, le=300)
    # Local reference images are read only from under these dirs (default:
    # <state dir>/inputs); the variable takes paths separated by ":".
    input_dirs: Annotated[list[Path], NoDecode] = Field(default_factory=list)
    # Checked before a byte is read: a reference image is a picture, not a video.
    max_reference_image_bytes: int = Field(default=50 * 1024**2, gt=0)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (
            init_settings,
            env_settings,
            dotenv_settings,
            TomlConfigSettingsSource(settings_cls),
        )

    @field_validator("webhook_urls", mode="before")
    @classmethod
    def _split_urls(cls, value: Any) -> Any:
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                return json.loads(text)
            return [part for part in text.replace(",", " ").split() if part]
        return value

    @field_validator("budgets", mode="before")
    @classmethod
    def _parse_budgets(cls, value: Any) -> Any:
        if isinstance(value, str):
            text = value.strip()
            return json.loads(text) if text.startswith("{") else parse_budgets(text)
        return value

    @field_validator("port")
    @classmethod
    def _port_range(cls, value: int | None) -> int | None:
        if value is not None and not 1 <= value <= 65535:
            raise ValueError("port must be within 1..65535")
        return value

    @field_validator("input_dirs", mode="before")
    @classmethod
    def _split_dirs(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [part for part in value.split(os.pathsep) if part.strip()]
        return value

    @property
    def resolved_input_dirs(self) -> list[Path]:
        return list(self.input_dirs) or [self.state_dir / "inputs"]

    @property
    def artifacts_retention(self) -> Retention:
        return Retention(max_bytes=self.artifacts_max_bytes, max_count=self.artifacts_max_count)

    @property
    def results_dir(self) -> Path:
        """Where result files are written (and served from)."""
        return self.shared_results_dir or self.state_dir / "results"

    @property
    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.state_dir / 'dispatcher.db'}"

    def provider_concurrency(self, provider: str, default: int | None = None) -> int:
        """The provider's quota, refused at start-up when outside 1..5.

        `default` (when given) replaces `default_concurrency` for a provider
        the operator did not name: a ComfyUI server is one GPU.
        """
        fallback = self.default_concurrency if default is None else default
        value = self.concurrency.get(provider, fallback)
        if not MIN_PROVIDER_CONCURRENCY <= value <= MAX_PROVIDER_CONCURRENCY:
            raise ConfigError(
                f"concurrency for API provider {provider!r} is {value}; it must be "
                f"between {MIN_PROVIDER_CONCURRENCY} and {MAX_PROVIDER_CONCURRENCY} "
                "(the provider's quota; asking for more only earns 429s)"
            )
        return value

    def browser(self) -> str:
        found = self.browser_executable or find_browser()
        if not found:
            raise ConfigError(
                "no Chromium found: install one (`make venv` does) or set "
                "DISPATCHER_BROWSER_EXECUTABLE"
            )
        return found
