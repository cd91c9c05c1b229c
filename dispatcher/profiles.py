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
from dataclasses import dataclass, field
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
from dispatcher.flows import WORKFLOW_PARAM, Flow, build_flows
from dispatcher.models import Kind
from dispatcher.pricing import Pricing
from dispatcher.profile_calls import (
    HttpCall,
    ReferenceSpec,
    ResultSpec,
    StatusSpec,
    UploadSpec,
    check_image_forms,
)
from dispatcher.profile_extras import AuthFields, ErrorWords, RateLimitSpec
from dispatcher.workflow import Graph, WorkflowError, load_workflow

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

# ``${NAME}``, or ``${NAME:-default}`` (used when NAME is set nowhere: the
# vendor catalog's real base URLs, which a test or a stand-in replaces).
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_RESET = re.compile(r"([01]\d|2[0-3]):[0-5]\d")
_HOST_ENTRY = re.compile(r"(\*\.)?[A-Za-z0-9_.-]{1,253}(:[0-9]{1,5})?")


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
    # Task params set in the page's controls before the prompt is sent
    # (`[web.fields]`: param = selector), in the order listed here, each
    # checked after it is set: a text input or textarea (filled), a range,
    # a <select> (by value or label), a checkbox (a true/false param) or a
    # file input (a path under the input dirs).
    fields: dict[str, str] = Field(default_factory=dict)
    # Reference images (issue 15): a file input, or a button that opens a
    # file chooser; and what shows the attachment is ready.
    upload: str | None = None
    upload_done: str | None = None
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
    # A regex over the error banner (`error`), or the page's text when the
    # profile has no `error`, saying the session is gone ("session expired",
    # "please log in again"): the account needs attention, no attempt is
    # charged, as for `logged_out`. Looked for while the page loads and
    # while it generates.
    logged_out_text: str | None = None
    # Nominal seconds an answer (text or media) may stay unchanged while the
    # page is busy before the attempt is reclaimed as stalled.
    stall_s: float = Field(default=120.0, gt=0)
    # What the browser itself may reach during a task: empty, any host; else
    # only these ("host", "host:port", "*.domain") and the host of `url`.
    allow_hosts: tuple[str, ...] = ()
    # Files a page starts downloading: denied unless true; then saved in the
    # state dir, cancelled and removed past max_download_bytes.
    downloads: bool = False
    # The account's allowance (issue 30): generations per account per day,
    # counted from `daily_reset` ("HH:MM" UTC); the scheduler gives a used-up
    # account no task until then. None: no allowance stated.
    daily_limit: int | None = Field(default=None, ge=1)
    daily_reset: str = "00:00"

    @property
    def reset_minute(self) -> int:
        """`daily_reset` as minutes after 00:00 UTC."""
        hours, minutes = self.daily_reset.split(":")
        return int(hours) * 60 + int(minutes)

    @model_validator(mode="after")
    def _one_way_to_submit(self) -> WebSpec:
        if not self.submit and not self.submit_key:
            raise ValueError("web needs `submit` (a selector) or `submit_key` (e.g. Enter)")
        for host in self.allow_hosts:
            if not _HOST_ENTRY.fullmatch(host):
                raise ValueError(
                    f"allow_hosts entry {host!r} is not a host, host:port or *.domain "
                    "(no scheme, no path)"
                )
        if not _RESET.fullmatch(self.daily_reset):
            raise ValueError(
                f"daily_reset {self.daily_reset!r} is not a UTC time HH:MM (e.g. 00:00, 07:30)"
            )
        for name in self.fields:
            if name == "prompt" or name in ("reference_image", "reference_images"):
                raise ValueError(f"fields: {name!r} is not a field (it goes to `input`/`upload`)")
        for key in ("limit_text", "logged_out_text"):
            pattern = getattr(self, key)
            if pattern is None:
                continue
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"{key} is not a valid regex: {exc}") from None
        return self


# A ComfyUI server's calls are fixed by ComfyUI itself; the profile names
# only the workflow and where parameters go.
_COMFYUI_SUBMIT = HttpCall(method="POST", path="/prompt")
_COMFYUI_ONLY = ("workflow", "workflows", "outputs", "overridable")
_MAPPING_KEYS = ("inputs", "images")  # styles 'comfyui' and 'gradio'
_GRADIO_ONLY = ("api_name", "values")
_GRADIO_API_NAME = re.compile(r"/[A-Za-z0-9_\-]{1,100}")


class ProviderSpec(_Strict):
    """`[api.providers.<name>]`: where one of several providers differs from `[api]`."""

    base_url: str | None = None
    auth_header: str | None = None
    auth_env: str | None = None
    auth_prefix: str | None = None


class ApiSpec(AuthFields):
    base_url: str
    auth_header: str = "Authorization"
    auth_env: str | None = None
    auth_prefix: str = "Bearer "
    style: Literal["chat", "async-job", "comfyui", "gradio"] = "chat"
    timeout_s: float = 600.0
    max_download_bytes: int | None = Field(default=None, gt=0)  # default: the setting
    # The lane's concurrency when the operator names none for this provider
    # (DISPATCHER_CONCURRENCY wins): the vendor's documented default quota.
    quota: int | None = Field(default=None, ge=1, le=5)
    # Sent with every call to base_url's origin (a version header).
    headers: dict[str, str] = Field(default_factory=dict)
    errors: ErrorWords = ErrorWords()
    rate_limit: RateLimitSpec | None = None
    submit: HttpCall = _COMFYUI_SUBMIT
    status: StatusSpec | None = None
    result: ResultSpec | None = None
    cancel: HttpCall | None = None
    # Reference images (issue 15): preparation and the multipart submit, and
    # the upload-first endpoint.
    references: ReferenceSpec = ReferenceSpec()
    upload: UploadSpec | None = None
    # style "comfyui": the workflow file (API format, relative to the
    # profile), where each task parameter goes ("<node>.inputs.<name>"),
    # which output nodes' files to collect (default: all), and which
    # parameters are images to upload first.
    # Or several workflows, one picked by each task's `workflow` param
    # (`dispatcher.flows`); places may name a node by its title; tasks may
    # set the node inputs `overridable` lists.
    workflow: str | None = None
    workflows: dict[str, str] = Field(default_factory=dict)
    inputs: dict[str, str] = Field(default_factory=dict)
    outputs: tuple[str, ...] | None = None
    images: dict[str, str] = Field(default_factory=dict)
    # style "gradio" (`apirunner.gradio`): the app's endpoint ("/generate"),
    # and fixed values for endpoint parameters no task sets; `inputs` and
    # `images` map task parameters to the endpoint's parameter names.
    api_name: str | None = None
    values: dict[str, Any] = Field(default_factory=dict)
    overridable: tuple[str, ...] = ()
    # A model served by several providers: what differs per provider.
    providers: dict[str, ProviderSpec] = Field(default_factory=dict)
    _flows: dict[str, Flow] = PrivateAttr(default_factory=dict)

    @property
    def flows(self) -> dict[str, Flow]:
        """The loaded workflows, mapping resolved (style "comfyui" only)."""
        if not self._flows:
            raise ConfigError("this profile has no ComfyUI workflow")
        return self._flows

    @property
    def graph(self) -> Graph:
        """The default (first) loaded workflow."""
        return next(iter(self.flows.values())).graph

    @model_validator(mode="after")
    def _style_needs(self, info: ValidationInfo) -> ApiSpec:
        given = [key for key in _GRADIO_ONLY if key in self.model_fields_set]
        if given and self.style != "gradio":
            raise ValueError(f"`{given[0]}` is only for style 'gradio'")
        if self.style == "comfyui":
            return self._load_workflow(info)
        if self.style == "gradio":
            return self._gradio_needs()
        if "submit" not in self.model_fields_set:
            raise ValueError(f"style {self.style!r} needs an [api.submit] table")
        given = [key for key in _COMFYUI_ONLY if key in self.model_fields_set]
        if given:
            raise ValueError(f"`{given[0]}` is only for style 'comfyui'")
        given = [key for key in _MAPPING_KEYS if key in self.model_fields_set]
        if given:
            raise ValueError(f"`{given[0]}` is only for styles 'comfyui' and 'gradio'")
        check_image_forms(self.submit.body, self.upload is not None)
        if self.style == "async-job" and self.status is None:
            raise ValueError("style 'async-job' needs an [api.status] table")
        if self.style == "chat" and (
            self.result is None or not (self.result.text or self.result.base64)
        ):
            raise ValueError(
                "style 'chat' needs [api.result] text (or base64) = '<path of the answer>'"
            )
        if self.auth_scheme == "jwt-hs256" and not (self.auth_env and self.auth_secret_env):
            raise ValueError("auth_scheme 'jwt-hs256' needs `auth_env` and `auth_secret_env`")
        return self

    def _gradio_needs(self) -> ApiSpec:
        others = [
            k
            for k in ("submit", "status", "result", "cancel", "upload", "workflow", "outputs")
            if k in self.model_fields_set
        ]
        if others:
            raise ValueError(
                f"style 'gradio' takes no `{others[0]}`: the app's API fixes its calls"
            )
        if not self.api_name or not _GRADIO_API_NAME.fullmatch(self.api_name):
            raise ValueError(
                "style 'gradio' needs `api_name = '/<endpoint>'` (as the app's "
                "'Use via API' page names it)"
            )
        targets = [*self.inputs.values(), *self.images.values(), *self.values]
        twice = sorted({t for t in targets if targets.count(t) > 1})
        if twice:
            raise ValueError(f"endpoint parameter {twice[0]!r} is set twice (inputs/images/values)")
        return self

    def _load_workflow(self, info: ValidationInfo) -> ApiSpec:
        others = [k for k in ("submit", "status", "result", "cancel") if k in self.model_fields_set]
        if others:
            raise ValueError(f"style 'comfyui' takes no [api.{others[0]}]: ComfyUI fixes its calls")
        if bool(self.workflow) == bool(self.workflows):
            raise ValueError(
                "style 'comfyui' needs `workflow = '<file>.json'` (API format), or "
                "`workflows = { <name> = '<file>.json', ... }`: one of the two"
            )
        if WORKFLOW_PARAM in self.inputs or WORKFLOW_PARAM in self.images:
            raise ValueError(f"`{WORKFLOW_PARAM}` is the task param that picks the workflow")
        base = (info.context or {}).get("profile_dir")
        files = self.workflows or {"default": self.workflow or ""}
        try:
            graphs = {
                name: load_workflow(Path(base, file) if base else Path(file))
                for name, file in files.items()
            }
            self._flows = build_flows(
                graphs,
                inputs=self.inputs,
                images=self.images,
                outputs=self.outputs,
                overridable=self.overridable,
                where="[api]",
            )
        except WorkflowError as exc:
            raise ValueError(str(exc)) from None
        return self


class BudgetSpec(_Strict):
    """`[budget]`: dollars each of the profile's providers may spend per day (UTC)."""

    daily_usd: float = Field(ge=0)


class Profile(_Strict):
    name: str
    kind: Kind
    accounts: tuple[str, ...] = ()
    # An API model names one provider, or several (each one lane, like the
    # accounts of a web model): exactly one of the two keys.
    provider: str | None = None
    providers: tuple[str, ...] = ()
    fingerprint_fields: tuple[str, ...] = DEFAULT_FINGERPRINT_FIELDS
    max_attempts: int = Field(default=3, ge=1, le=10)
    web: WebSpec | None = None
    api: ApiSpec | None = None
    # Prices (issue 30): a task's estimated cost, and the day's budget of
    # each of its providers (DISPATCHER_BUDGETS overrides it).
    pricing: Pricing | None = None
    budget: BudgetSpec | None = None
    # Nominal seconds one task usually runs (the vendor's or the operator's
    # figure): the plan's makespan uses it until the model has run history.
    expected_run_s: float | None = Field(default=None, gt=0, le=86_400)
    # A task's run time follows one of its params (a video's seconds set its
    # render time): a task with it is expected to run param x run_s_per_unit
    # nominal seconds; one without falls back to history / expected_run_s.
    run_s_param: str | None = Field(default=None, min_length=1)
    run_s_per_unit: float | None = Field(default=None, gt=0, le=86_400)
    source: str = ""  # the file it came from (filled in by the loader)

    @model_validator(mode="after")
    def _run_s_param_whole(self) -> Profile:
        if (self.run_s_param is None) != (self.run_s_per_unit is None):
            missing = "run_s_per_unit" if self.run_s_per_unit is None else "run_s_param"
            raise ValueError(
                f"`run_s_param` and `run_s_per_unit` go together: `{missing}` is missing"
            )
        return self

    @model_validator(mode="after")
    def _kind_matches_tables(self) -> Profile:
        if self.kind is Kind.WEB:
            if self.web is None or not self.accounts:
                raise ValueError("a web profile needs `accounts` and a [web] table")
            if self.api is not None or self.provider or self.providers:
                raise ValueError("a web profile has no `provider`, `providers` or [api] table")
        else:
            if self.api is None:
                raise ValueError("an api profile needs `provider` and an [api] table")
            if self.web is not None or self.accounts:
                raise ValueError("an api profile has no `accounts` or [web] table")
            _check_providers(self.provider, self.providers, self.api)
        return self

    @property
    def provider_names(self) -> tuple[str, ...]:
        """The providers that serve this API model, one lane each; () for a web model."""
        return (self.provider,) if self.provider else self.providers

    def api_for(self, provider: str) -> ApiSpec:
        """The `[api]` table as `provider` sees it: its own base URL and key, if it has any."""
        if self.api is None or provider not in self.provider_names:
            raise ConfigError(
                f"model {self.name!r} is not served by provider {provider!r} "
                f"(its providers: {', '.join(self.provider_names) or 'none'})"
            )
        spec = self.api.providers.get(provider)
        changes = spec.model_dump(exclude_none=True) if spec is not None else {}
        # model_copy keeps the loaded workflow (a private attribute).
        return self.api.model_copy(update=changes) if changes else self.api

    @property
    def queue(self) -> str:
        # Per model, not per provider: every lane of a provider that serves
        # the model takes from it, as every account of a web model does.
        return f"api-model:{self.name}" if self.kind is Kind.API else f"web:{self.name}"


def _check_providers(provider: str | None, providers: tuple[str, ...], api: ApiSpec) -> None:
    if provider and providers:
        raise ValueError("give `provider` (one) or `providers` (a list), not both")
    names = (provider,) if provider else providers
    if not names or not all(name.strip() for name in names):
        raise ValueError("an api profile needs `provider` (or `providers`) and an [api] table")
    if len(set(names)) != len(names):
        twice = next(name for name in names if names.count(name) > 1)
        raise ValueError(f"`providers` names {twice!r} twice")
    for extra in api.providers:
        if extra not in names:
            raise ValueError(
                f"[api.providers.{extra}] names no provider of this model "
                f"(its providers: {', '.join(names)})"
            )


def _expand(value: Any, variables: Mapping[str, str], missing: set[str]) -> Any:
    if isinstance(value, str):

        def sub(match: re.Match[str]) -> str:
            name = match.group(1)
            if name in variables:
                return variables[name]
            if name in os.environ:
                return os.environ[name]
            if match.group(2) is not None:
                return match.group(2)
            missing.add(name)
            return match.group(0)

        return _VAR.sub(sub, value)
    if isinstance(value, dict):
        return {k: _expand(v, variables, missing) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand(v, variables, missing) for v in value]
    return value


def referenced_variables(path: Path) -> set[str]:
    """The `${NAME}` variables a profile file mentions (set or not, with a default or not)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return set()
    return {match.group(1) for match in _VAR.finditer(text)}


def _errors(exc: ValidationError) -> list[tuple[str, str]]:
    """Every (dotted key, why) pydantic found, not only the first."""
    found = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "(file)"
        if err["type"] == "extra_forbidden":
            found.append((where, "unknown key"))
        else:
            found.append((where, err["msg"]))
    return found


@dataclass(frozen=True)
class ProfileProblem:
    """One thing wrong with a profile file: which file, which key, why."""

    file: str
    key: str  # dotted path into the file, or "(file)"
    why: str
    model: str | None = None  # the model the file names, when it could be read

    def __str__(self) -> str:
        return f"profile {self.file}: `{self.key}`: {self.why}"

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "key": self.key, "why": self.why, "model": self.model}


@dataclass
class ProfileSet:
    """What a profiles dir holds: the valid profiles and every problem of the others."""

    profiles: dict[str, Profile] = field(default_factory=dict)
    problems: list[ProfileProblem] = field(default_factory=list)
    # Valid files left out because a `${NAME}` they use is set nowhere.
    skipped: list[ProfileProblem] = field(default_factory=list)

    def invalid_models(self) -> dict[str, str]:
        """Model name -> why it is not loaded, for broken or skipped files that name one."""
        invalid: dict[str, list[ProfileProblem]] = {}
        for problem in self.problems:
            if problem.model and problem.model not in self.profiles:
                invalid.setdefault(problem.model, []).append(problem)
        why = {model: _file_message(found) for model, found in invalid.items()}
        for skip in self.skipped:
            if skip.model and skip.model not in self.profiles:
                why.setdefault(skip.model, f"profile {skip.file} is skipped: {skip.why}")
        return why


_Read = tuple[Profile | None, list[ProfileProblem], ProfileProblem | None]


def _skip_why(missing: set[str]) -> str:
    names = ", ".join(f"${{{name}}}" for name in sorted(missing))
    hint = (
        "start the service with --demo"
        if all(name.startswith("DEMO_") for name in missing)
        else "set it in the service's environment"
    )
    return f"it needs {names}, which nothing provides ({hint})"


def _read(path: Path, variables: Mapping[str, str]) -> _Read:
    """One file: its profile (None when invalid or skipped), its problems, why it is skipped."""
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        return None, [ProfileProblem(str(path), "(file)", f"cannot read it: {exc}")], None
    named = raw.get("name")
    model = named if isinstance(named, str) and named else None
    missing: set[str] = set()
    expanded = _expand(raw, variables, missing)
    try:
        profile = Profile.model_validate(
            {**expanded, "source": str(path)}, context={"profile_dir": str(path.parent)}
        )
    except ValidationError as exc:
        problems = [ProfileProblem(str(path), key, why, model) for key, why in _errors(exc)]
        return None, problems, None
    if missing:
        skip = ProfileProblem(str(path), "(skipped)", _skip_why(missing), profile.name)
        log.warning("profile %s skipped: %s", path.name, skip.why)
        return None, [], skip
    return profile, [], None


def parse_profile(path: Path, variables: Mapping[str, str] | None = None) -> Profile | None:
    """One profile file; None when it references variables nobody provides."""
    profile, problems, _ = _read(path, variables or {})
    if problems:
        raise ConfigError(_file_message(problems))
    return profile


def _file_message(problems: list[ProfileProblem]) -> str:
    """One line for one file's problems (they all share the file)."""
    whys = []
    for problem in problems:
        if problem.key == "(file)":
            whys.append(problem.why)
        elif problem.why == "unknown key":
            whys.append(f"unknown key `{problem.key}`")
        else:
            whys.append(f"`{problem.key}`: {problem.why}")
    return f"profile {problems[0].file}: {'; '.join(whys)}"


def read_profiles(directory: Path, variables: Mapping[str, str] | None = None) -> ProfileSet:
    """Every profile in `directory`, collecting every problem instead of stopping at one.

    Raises ConfigError only when the directory itself is missing.
    """
    if not directory.is_dir():
        raise ConfigError(f"profiles dir {directory} does not exist")
    found = ProfileSet()
    for path in sorted(directory.glob("*.toml")):
        profile, problems, skipped = _read(path, variables or {})
        found.problems.extend(problems)
        if skipped is not None:
            found.skipped.append(skipped)
        if profile is None:
            continue
        if profile.name in found.profiles:
            found.problems.append(
                ProfileProblem(
                    str(path),
                    "name",
                    f"model name {profile.name!r} is already defined by "
                    f"{found.profiles[profile.name].source}",
                )
            )
            continue
        found.profiles[profile.name] = profile
    return found


def load_profiles(
    directory: Path, variables: Mapping[str, str] | None = None
) -> dict[str, Profile]:
    """The valid profiles; ConfigError naming the first problem when any file is wrong."""
    found = read_profiles(directory, variables)
    if found.problems:
        first = found.problems[0].file
        raise ConfigError(_file_message([p for p in found.problems if p.file == first]))
    return found.profiles
