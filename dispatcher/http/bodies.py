"""Request bodies of the local API as pydantic models: one source of truth.

They validate every task and job body (through `dispatcher.tasks.spec`, which
the CLI's batch-file check shares) and their JSON schemas are the request
schemas of /openapi.json, so the document states exactly the bounds the
server enforces.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, with_config
from typing_extensions import TypedDict

from dispatcher.errors import InputError
from dispatcher.http.limits import MAX_JOB_TASKS
from dispatcher.tasks.spec import REF_PATTERN

MAX_MODEL_CHARS = 200
MAX_JOB_NAME_CHARS = 500
# AccountBook.disable's bound; dispatcher.accounts.switches itself is too heavy to
# import here (a unit test keeps the two equal).
MAX_REASON_CHARS = 500


@with_config(ConfigDict(extra="allow", strict=True))
class Params(TypedDict, total=False):
    """The prompt and the model's parameters; keys the profile does not use are kept
    but do not count for de-duplication. Values are strict JSON: finite numbers,
    64-bit integers, text without lone surrogates, at most 64 levels deep."""

    prompt: str
    negative_prompt: str
    reference_image: str | None
    reference_images: list[str] | None


class TaskBody(BaseModel):
    """One task: a model and what to ask of it."""

    model_config = ConfigDict(extra="forbid", strict=True, title="TaskBody")

    model: str = Field(
        min_length=1, max_length=MAX_MODEL_CHARS, description="a model name from profiles/"
    )
    params: Params = Field(default_factory=lambda: Params())
    force: bool = Field(default=False, description="bypass de-duplication and the cache")
    ref: str | None = Field(
        default=None,
        pattern=f"^{REF_PATTERN.pattern}$",
        description="the task's name in its job (unique there); names its result files",
    )
    models: list[Annotated[str, Field(min_length=1, max_length=MAX_MODEL_CHARS)]] | None = Field(
        default=None,
        max_length=5,
        description="equivalent models to fall back on: the task waits in their queues "
        "too and runs once, on whichever lane frees first, as that model's task",
    )
    priority: int | None = Field(
        default=None,
        ge=-1000,
        le=1000,
        description="higher runs first within its queue (default 0, or the job's)",
    )
    deadline: float | str | None = Field(
        default=None,
        description="finish by then: epoch seconds or ISO 8601 time (2026-12-04T09:00:00Z); "
        "among equal priorities the earliest deadline runs first",
    )
    deadline_action: Literal["run", "cancel"] | None = Field(
        default=None,
        description='"cancel": cancel it when its turn comes too late to meet the deadline; '
        '"run" (default): run it anyway, flagged late',
    )


class JobBody(BaseModel):
    """A named batch of tasks, accepted whole or not at all."""

    model_config = ConfigDict(extra="forbid", strict=True, title="JobBody")

    name: str = Field(min_length=1, max_length=MAX_JOB_NAME_CHARS, pattern=r"\S")
    tasks: list[TaskBody] = Field(min_length=1, max_length=MAX_JOB_TASKS)
    priority: int | None = Field(
        default=None, ge=-1000, le=1000, description="every task's priority unless it has its own"
    )
    deadline: float | str | None = Field(
        default=None, description="every task's deadline unless it has its own"
    )
    deadline_action: Literal["run", "cancel"] | None = Field(
        default=None, description="every task's deadline_action unless it has its own"
    )


class PlanBody(BaseModel):
    """A batch to plan, not to run: its tasks, and the limits it must meet."""

    model_config = ConfigDict(extra="forbid", strict=True, title="PlanBody")

    tasks: list[TaskBody] = Field(min_length=1, max_length=MAX_JOB_TASKS)
    max_cost_usd: float | None = Field(
        default=None, ge=0, description="refuse (ok: false) when the estimate is over it"
    )
    deadline: float | str | None = Field(
        default=None,
        description="refuse when the makespan estimate ends after it (epoch s or ISO 8601)",
    )


class DisableBody(BaseModel):
    """Why a lane is switched off (shown on the dashboard)."""

    model_config = ConfigDict(extra="forbid", strict=True, title="DisableBody")

    reason: str = Field(min_length=1, max_length=MAX_REASON_CHARS, pattern=r"\S")


class AccountBody(BaseModel):
    """A web account to add while serving, and the web models it serves."""

    model_config = ConfigDict(extra="forbid", strict=True, title="AccountBody")

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    models: list[Annotated[str, Field(min_length=1, max_length=200)]] = Field(
        min_length=1, max_length=100
    )


def validate(model: type[BaseModel], raw: Any, where: str) -> None:
    """Check `raw` against `model`, or raise `InputError` with one clear sentence."""
    try:
        model.model_validate(raw)
    except ValidationError as exc:
        raise InputError(message(exc.errors(), where)) from None


def _where(prefix: str, loc: tuple[int | str, ...]) -> str:
    return prefix + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc)


def message(errors: list[Any], where: str) -> str:
    """One clear sentence for pydantic's first error, naming the field as the
    client wrote it (``tasks[3].params.prompt``)."""
    first = errors[0]
    loc = tuple(first["loc"])
    kind = first["type"]
    ctx = first.get("ctx") or {}
    if kind == "extra_forbidden":
        parent = loc[:-1]
        unknown = sorted(
            str(e["loc"][-1])
            for e in errors
            if e["type"] == "extra_forbidden" and tuple(e["loc"][:-1]) == parent
        )
        return f"{_where(where, parent)} has unknown field(s): {', '.join(unknown)}"
    field = _where(where, loc)
    if kind in ("model_type", "dict_type", "typed_dict_type", "model_attributes_type"):
        return f"{field} must be a JSON object"
    if (
        loc
        and loc[-1] in ("model", "name", "reason")
        and kind
        in (
            "string_type",
            "string_too_short",
            "string_pattern_mismatch",
            "missing",
        )
    ):
        return f"{field} must be a non-empty string"
    if loc and loc[-1] == "ref" and kind in ("string_type", "string_pattern_mismatch"):
        return f"{field} must be 1-100 characters of A-Z a-z 0-9 . _ - (not starting with .)"
    if kind == "missing":
        return f"{field} is required"
    if kind == "string_type":
        return f"{field} must be a string"
    if kind == "bool_type":
        return f"{field} must be true or false"
    if kind == "list_type":
        return f"{field} must be a list"
    if kind == "string_too_long":
        return f"{field} must be at most {ctx.get('max_length')} characters"
    if kind == "too_short":
        return f"{field} must not be empty"
    if kind == "too_long":
        return f"{field} takes at most {ctx.get('max_length')} items"
    return f"{field}: {first['msg']}"


MAX_SESSION_FILE_CHARS = 1_000_000


class LoginInputBody(BaseModel):
    """One input of the operator into a remote login's page.

    ``mouse`` (action down/up/move, button) and ``wheel`` (dx, dy in pixels)
    point at x, y: fractions 0..1 of the shown frame. ``key`` is one
    character or a key name (Enter, Backspace, Tab, arrows ...); ``text`` is
    pasted as is.
    """

    model_config = ConfigDict(extra="forbid", strict=True, title="LoginInputBody")

    type: Literal["mouse", "wheel", "key", "text"]
    action: Literal["down", "up", "move"] | None = None
    button: Literal["left", "middle", "right", "none"] = "left"
    x: float | None = Field(default=None, ge=0, le=1)
    y: float | None = Field(default=None, ge=0, le=1)
    dx: float = Field(default=0, ge=-10_000, le=10_000)
    dy: float = Field(default=0, ge=-10_000, le=10_000)
    key: str | None = Field(default=None, min_length=1, max_length=20)
    text: str | None = Field(default=None, min_length=1, max_length=10_000)


class ImportBody(BaseModel):
    """A session file's text: Playwright storage-state JSON or Netscape cookies.txt."""

    model_config = ConfigDict(extra="forbid", strict=True, title="ImportBody")

    text: str = Field(min_length=1, max_length=MAX_SESSION_FILE_CHARS)
