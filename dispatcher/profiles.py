"""Model profiles: one TOML file per model in the profiles dir.

Adding a model is a new file, not new code. Unknown keys are an error naming
the file and the key. A value may reference ``${NAME}``; names resolve from
the mapping given to `load_profiles` (the demo's backend URLs) and then the
environment. A profile whose variables cannot be resolved is skipped with a
warning, so the bundled demo profiles stay inert outside ``--demo``.
"""

from __future__ import annotations

import logging
import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    model_validator,
)

from dispatcher.errors import ConfigError
from dispatcher.models import Kind
from dispatcher.workflow import Graph, WorkflowError, check_mapping, load_workflow

log = logging.getLogger("dispatcher.profiles")

DEFAULT_FINGERPRINT_FIELDS = (
    "prompt",
    "negative_prompt",
    "aspect_ratio",
    "duration",
    "resolution",
    "seed",
    "model_version",
    "style_preset",
)

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class WebSpec(_Strict):
    url: str
    instructions: str = ""
    need_empty_prompt: bool = False
    logged_in: str
    logged_out: str | None = None
    input: str
    submit: str | None = None
    submit_key: str | None = None
    busy: str | None = None
    stop: str | None = None
    answer: str
    done: str | None = None
    stable_ms: int = 1500
    error: str | None = None
    media: str | None = None
    timeout_s: float = 600.0
    # Record a Playwright trace of every attempt; kept only when one goes wrong.
    trace: bool = False
    max_download_bytes: int | None = Field(default=None, gt=0)  # default: the setting
    # A usage cap: the selector of its message and/or a regex over that
    # message (or, without `limit`, over the page's text). The reset time is
    # read from the regex's group `reset` (else the whole match), in the forms
    # sites use ("after 2:14 PM", "in 3 hours", "at 14:00 UTC", "tomorrow");
    # without one the account cools down for `cooldown_s` (nominal seconds).
    limit: str | None = None
    limit_text: str | None = None
    cooldown_s: float = Field(default=3600.0, gt=0)
    # A human check (a captcha, "verify you are human"): the account needs attention.
    challenge: str | None = None
    # Nominal seconds an answer (text or media) may stay unchanged while the
    # page is busy before the attempt is reclaimed as stalled.
    stall_s: float = Field(default=120.0, gt=0)

    @model_validator(mode="after")
    def _one_way_to_submit(self) -> WebSpec:
        if not self.submit and not self.submit_key:
            raise ValueError("web needs `submit` (a selector) or `submit_key` (e.g. Enter)")
        if self.limit_text is not None:
            try:
                re.compile(self.limit_text)
            except re.error as exc:
                raise ValueError(f"limit_text is not a valid regex: {exc}") from None
        return self


class HttpCall(_Strict):
    method: str = "GET"
    path: str | None = None  # appended to base_url, may contain {id} and {param}
    url: str | None = None  # dotted path into the submit answer holding a full URL
    body: dict[str, Any] | None = None
    id: str | None = None  # dotted path of the remote id in the answer


class StatusSpec(_Strict):
    path: str | None = None
    url: str | None = None
    state: str = "status"
    progress: str | None = None
    queue_position: str | None = None
    error: str | None = None
    map: dict[str, Literal["pending", "running", "success", "failed", "canceled"]] = Field(
        default_factory=dict
    )


class ResultSpec(_Strict):
    path: str | None = None  # download this (relative to base_url)
    url: str | None = None  # a URL found at this dotted path (status or submit answer)
    text: str | None = None  # text found at this dotted path


# A ComfyUI server's calls are fixed by ComfyUI itself; the profile names
# only the workflow and where parameters go.
_COMFYUI_SUBMIT = HttpCall(method="POST", path="/prompt")
_COMFYUI_ONLY = ("workflow", "inputs", "outputs", "images")


class ApiSpec(_Strict):
    base_url: str
    auth_header: str = "Authorization"
    auth_env: str | None = None
    auth_prefix: str = "Bearer "
    style: Literal["chat", "async-job", "comfyui"] = "chat"
    timeout_s: float = 600.0
    max_download_bytes: int | None = Field(default=None, gt=0)  # default: the setting
    submit: HttpCall = _COMFYUI_SUBMIT
    status: StatusSpec | None = None
    result: ResultSpec | None = None
    cancel: HttpCall | None = None
    # style "comfyui": the workflow file (API format, relative to the
    # profile), where each task parameter goes ("<node>.inputs.<name>"),
    # which output nodes' files to collect (default: all), and which
    # parameters are images to upload first.
    workflow: str | None = None
    inputs: dict[str, str] = Field(default_factory=dict)
    outputs: tuple[str, ...] | None = None
    images: dict[str, str] = Field(default_factory=dict)
    _graph: Graph | None = PrivateAttr(default=None)

    @property
    def graph(self) -> Graph:
        """The loaded workflow (style "comfyui" only)."""
        if self._graph is None:
            raise ConfigError("this profile has no ComfyUI workflow")
        return self._graph

    @model_validator(mode="after")
    def _style_needs(self, info: ValidationInfo) -> ApiSpec:
        if self.style == "comfyui":
            return self._load_workflow(info)
        if "submit" not in self.model_fields_set:
            raise ValueError(f"style {self.style!r} needs an [api.submit] table")
        given = [key for key in _COMFYUI_ONLY if key in self.model_fields_set]
        if given:
            raise ValueError(f"`{given[0]}` is only for style 'comfyui'")
        if self.style == "async-job" and self.status is None:
            raise ValueError("style 'async-job' needs an [api.status] table")
        if self.style == "chat" and (self.result is None or not self.result.text):
            raise ValueError("style 'chat' needs [api.result] text = '<path of the answer>'")
        return self

    def _load_workflow(self, info: ValidationInfo) -> ApiSpec:
        others = [k for k in ("submit", "status", "result", "cancel") if k in self.model_fields_set]
        if others:
            raise ValueError(f"style 'comfyui' takes no [api.{others[0]}]: ComfyUI fixes its calls")
        if not self.workflow:
            raise ValueError("style 'comfyui' needs `workflow = '<file>.json'` (API format)")
        base = (info.context or {}).get("profile_dir")
        path = Path(base, self.workflow) if base else Path(self.workflow)
        try:
            graph = load_workflow(path)
            check_mapping(graph, {**self.inputs, **self.images}, self.outputs, "[api]")
        except WorkflowError as exc:
            raise ValueError(str(exc)) from None
        self._graph = graph
        return self


class Profile(_Strict):
    name: str
    kind: Kind
    accounts: tuple[str, ...] = ()
    provider: str | None = None
    fingerprint_fields: tuple[str, ...] = DEFAULT_FINGERPRINT_FIELDS
    max_attempts: int = Field(default=3, ge=1, le=10)
    web: WebSpec | None = None
    api: ApiSpec | None = None
    source: str = ""  # the file it came from (filled in by the loader)

    @model_validator(mode="after")
    def _kind_matches_tables(self) -> Profile:
        if self.kind is Kind.WEB:
            if self.web is None or not self.accounts:
                raise ValueError("a web profile needs `accounts` and a [web] table")
            if self.api is not None or self.provider:
                raise ValueError("a web profile has no `provider` or [api] table")
        else:
            if self.api is None or not self.provider:
                raise ValueError("an api profile needs `provider` and an [api] table")
            if self.web is not None or self.accounts:
                raise ValueError("an api profile has no `accounts` or [web] table")
        return self

    @property
    def lane_group(self) -> str:
        return f"api:{self.provider}" if self.kind is Kind.API else f"web:{self.name}"


def _expand(value: Any, variables: Mapping[str, str], missing: set[str]) -> Any:
    if isinstance(value, str):

        def sub(match: re.Match[str]) -> str:
            name = match.group(1)
            if name in variables:
                return variables[name]
            if name in os.environ:
                return os.environ[name]
            missing.add(name)
            return match.group(0)

        return _VAR.sub(sub, value)
    if isinstance(value, dict):
        return {k: _expand(v, variables, missing) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand(v, variables, missing) for v in value]
    return value


def _describe(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "(file)"
        if err["type"] == "extra_forbidden":
            parts.append(f"unknown key `{where}`")
        else:
            parts.append(f"`{where}`: {err['msg']}")
    return "; ".join(parts)


def parse_profile(path: Path, variables: Mapping[str, str] | None = None) -> Profile | None:
    """One profile file; None when it references variables nobody provides."""
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"profile {path}: cannot read it: {exc}") from exc
    missing: set[str] = set()
    expanded = _expand(raw, variables or {}, missing)
    try:
        profile = Profile.model_validate(
            {**expanded, "source": str(path)}, context={"profile_dir": str(path.parent)}
        )
    except ValidationError as exc:
        raise ConfigError(f"profile {path}: {_describe(exc)}") from exc
    if missing:
        log.warning(
            "profile %s skipped: it needs %s, which nothing provides",
            path.name,
            ", ".join(f"${{{name}}}" for name in sorted(missing)),
        )
        return None
    return profile


def load_profiles(
    directory: Path, variables: Mapping[str, str] | None = None
) -> dict[str, Profile]:
    if not directory.is_dir():
        raise ConfigError(f"profiles dir {directory} does not exist")
    profiles: dict[str, Profile] = {}
    for path in sorted(directory.glob("*.toml")):
        profile = parse_profile(path, variables)
        if profile is None:
            continue
        if profile.name in profiles:
            raise ConfigError(
                f"profile {path}: model name {profile.name!r} is already defined by "
                f"{profiles[profile.name].source}"
            )
        profiles[profile.name] = profile
    return profiles
