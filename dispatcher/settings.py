"""Settings from `DISPATCHER_*` environment variables, `.env` or `dispatcher.toml`."""

from __future__ import annotations

import json
import os
import shutil
import socket
from pathlib import Path
from typing import Annotated, Any, Literal

import psutil
from pydantic import Field, field_validator
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from dispatcher.errors import ConfigError
from dispatcher.pricing import parse_budgets
from dispatcher.tasks.artifacts import Retention

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


def default_browser_memory_mb() -> int:
    """Half of the machine's memory, in MB (`browser_memory_mb` unset)."""
    total_bytes: int = psutil.virtual_memory().total
    return max(1, total_bytes // 2 // 1024**2)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="DISPATCHER_",
        env_file=".env",
        env_file_encoding="utf-8",
        extra="ignore",
        toml_file="dispatcher.toml",
    )

    # Every field carries its `description` (and, when the default is computed
    # on the machine, its `shown_default`): docs/settings.md is generated from
    # them (`python -m dispatcher.settings_doc > docs/settings.md`).
    state_dir: Path = Field(
        default_factory=default_state_dir,
        description="database, token, port, browser profiles, results, cache",
        json_schema_extra={
            "shown_default": "`$XDG_STATE_HOME/dispatcher` (`~/.local/state/dispatcher`)"
        },
    )
    database_url: str | None = Field(
        default=None,
        description="`sqlite:///path` or `postgresql://user@host:5432/db` "
        "(see docs/operations.md and docs/several-hosts.md)",
        json_schema_extra={"shown_default": "SQLite in the state dir"},
    )
    host_id: str = Field(
        default_factory=socket.gethostname,
        min_length=1,
        max_length=200,
        description="this machine's name among the hosts sharing one PostgreSQL database",
        json_schema_extra={"shown_default": "the hostname"},
    )
    shared_results_dir: Path | None = Field(
        default=None,
        description="one results dir mounted at this same path on every host sharing the "
        "database: each host writes its results there and any host serves any task's "
        "files (docs/several-hosts.md)",
        json_schema_extra={"shown_default": "none (`<state dir>/results`)"},
    )
    profiles_dir: Path = Field(
        default=BUNDLED_PROFILES_DIR,
        description="one TOML per model (docs/profiles.md)",
        json_schema_extra={"shown_default": "the bundled `profiles/`"},
    )
    port: int | None = Field(
        default=None,
        description="the local API's port (always on 127.0.0.1)",
        json_schema_extra={"shown_default": "a free one in 49152-65535"},
    )
    browser_executable: str | None = Field(
        default=None,
        description="the Chromium that web models run in",
        json_schema_extra={"shown_default": "a Chromium found on the machine"},
    )
    headless: bool = Field(default=True, description="run Chromium without a window")
    browser_keep_alive_s: float = Field(
        default=60.0,
        ge=0,
        # The next task skips the launch (~2-7 s).
        description="real seconds a web account's browser stays open after a task, with "
        "the model's page pre-loaded for the next one; `0` closes it after every task",
    )
    browser_memory_mb: int | None = Field(
        default=None,
        gt=0,
        description="memory (MB, as PSS) the service and its browsers may hold on this "
        "host: a browser start that would go over it first closes idle kept browsers, "
        "least recently used first, and waits while only running ones could make room "
        "(a running generation is never closed for it); below one browser, one at a time",
        json_schema_extra={"shown_default": "half of the machine's memory"},
    )
    browser_prewarm: bool = Field(
        default=True,
        description="start each web account's browser when its lane opens (start, an "
        "account added, enabled again or back from a cooldown), in the background, on "
        "its model's page with the logged-in check done, so its first task skips the "
        "start; a logged-out, human-check or usage-cap page found then marks the account "
        "with no task spent; closed after `browser_keep_alive_s` without a task; `false`: "
        "the first task starts it",
    )
    concurrency: dict[str, int] = Field(
        default_factory=dict,
        description='per API provider quota as JSON, e.g. `{"openai": 3}`; each 1..5',
        json_schema_extra={"shown_default": "`{}`"},
    )
    budgets: Annotated[dict[str, float], NoDecode] = Field(
        default_factory=dict,
        description="dollars each API provider may spend per day (00:00 to 00:00 UTC), "
        "`acme-video=50, demo=12.5` or a JSON object; over a profile's `[budget]`",
        json_schema_extra={"shown_default": "`{}` (none)"},
    )
    default_concurrency: int = Field(
        default=DEFAULT_PROVIDER_CONCURRENCY,
        description="the quota of a provider `concurrency` does not name (a ComfyUI "
        "server: 1); 1..5",
    )
    cache_max_bytes: int = Field(default=2 * 1024**3, description="result cache size cap")
    cache_ttl_s: float = Field(
        default=7 * 24 * 3600.0, description="how long a cached result is reused"
    )
    artifacts_max_bytes: int = Field(
        default=256 * 1024**2,
        ge=0,
        description="what failed attempts leave for a person to look at (screenshots, page "
        "HTML, traces, the vendor's last answer), in all; the oldest attempts' go first",
    )
    artifacts_max_count: int = Field(default=200, ge=1, description="the same, counted in attempts")
    time_scale: float = Field(
        default=1.0, gt=0, description="multiplies every internal timer (tests, benchmarks)"
    )
    http_timeout_s: float = Field(
        default=30.0,
        description="timeout of one request to an API provider (a chat answer may take "
        "the profile's longer `timeout_s`)",
    )
    max_download_bytes: int = Field(
        default=2 * 1024**3,
        gt=0,
        description="largest result file or web medium; a profile's `max_download_bytes` "
        "(in `[api]` or `[web]`) overrides it",
    )
    max_json_bytes: int = Field(
        default=16 * 1024**2, gt=0, description="largest JSON answer read from a vendor"
    )
    retry_delay_s: float = Field(
        default=5.0,
        description="the wait before a retryable failure's next attempt, doubled at each attempt",
    )
    account_failures_for_attention: int = Field(
        default=3,
        ge=1,
        description="failures of one kind in a row that mark a web account or provider "
        "*needs attention* (with the kind as the reason)",
    )
    log_format: Literal["text", "json"] = Field(
        default="text", description="`json` for log shippers (the systemd unit sets it)"
    )
    event_loop: Literal["auto", "uvloop", "asyncio"] = Field(
        default="auto",
        description="`auto`: uvloop when installed (uvicorn's production choice); "
        "`asyncio` pins the standard library's loop should a platform misbehave; the "
        "start-up line names the loop in use",
    )
    http_parser: Literal["auto", "httptools", "h11"] = Field(
        default="auto",
        description="`auto`: httptools when installed; `h11` pins the pure-Python parser",
    )
    log_level: str = Field(default="INFO", description="`DEBUG`, `INFO`, `WARNING`, ...")
    demo: bool = Field(
        default=False,
        description="start the bundled demo backends and log the demo accounts in "
        "(`serve --demo`, `make demo`)",
    )
    webhook_urls: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="endpoints told of `job.finished` and `account.state_changed` "
        "(comma- or space-separated, or a JSON list); see docs/operations.md",
        json_schema_extra={"shown_default": "none"},
    )
    webhook_secret: str | None = Field(
        default=None,
        description="signs every webhook (`X-Dispatcher-Signature`); 16+ characters, "
        "required with the URLs",
    )
    webhook_deadline_s: float = Field(
        default=10.0,
        gt=0,
        le=300,
        # Not per read: a receiver dripping its answer is cut off here.
        description="real seconds one webhook POST may take in all",
    )
    input_dirs: Annotated[list[Path], NoDecode] = Field(
        default_factory=list,
        description="dirs (`:`-separated) that local `reference_image` paths must lie "
        'under; anything else is refused with one message for "not allowed or not found"',
        json_schema_extra={"shown_default": "`<state dir>/inputs`"},
    )
    max_reference_image_bytes: int = Field(
        default=50 * 1024**2,
        gt=0,
        # Checked before a byte is read: a reference image is a picture, not a video.
        description="a larger reference image file is refused before it is read",
    )

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
    def browser_memory_budget_mb(self) -> int:
        """`browser_memory_mb`, or half of the machine's memory when unset: the
        other half stays for the system, the database and the page cache."""
        if self.browser_memory_mb is not None:
            return self.browser_memory_mb
        return default_browser_memory_mb()

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
