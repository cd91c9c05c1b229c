"""A task as a client states it, checked before anything is stored.

Kept free of heavy imports: the CLI checks batch files with it too, so a bad
line is reported with its line number before anything is sent. The rules
are the pydantic models in `dispatcher.http.bodies` (also the schemas of
/openapi.json); they are imported on first use, so a CLI command that checks
no batch file never pays for pydantic.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from dispatcher.errors import InputError
from dispatcher.models import JSON
from dispatcher.strictjson import check_value


@dataclass(frozen=True)
class TaskSpec:
    model: str
    params: JSON = field(default_factory=dict)
    force: bool = False
    ref: str | None = None
    priority: int = 0
    deadline: float | None = None  # epoch seconds
    deadline_action: str = "run"  # or "cancel"
    fallbacks: tuple[str, ...] = ()  # equivalent models, in the order preferred


# A ref names the task's result files (`dispatcher results`): no leading dot,
# so never "." or ".." nor a hidden file.
REF_PATTERN = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,99}")


def _validated(model_name: str, raw: Any, where: str) -> None:
    from dispatcher.http import bodies

    bodies.validate(getattr(bodies, model_name), raw, where)


def parse_deadline(value: Any, where: str) -> float | None:
    """A deadline as epoch seconds: a number, or an ISO 8601 time (UTC unless
    it names its offset)."""
    if value is None:
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        if not math.isfinite(value) or value < 0:
            raise InputError(f"{where}.deadline must be a time after 1970")
        return float(value)
    if isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            raise InputError(
                f"{where}.deadline {value[:40]!r} is not an ISO 8601 time "
                "(e.g. 2026-12-04T09:00:00Z) nor epoch seconds"
            ) from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        return moment.timestamp()
    raise InputError(f"{where}.deadline must be epoch seconds or an ISO 8601 time")


def _spec(raw: dict[str, Any], where: str, defaults: dict[str, Any] | None = None) -> TaskSpec:
    # The client's own values, not the model's copies: params keep every key.
    params = raw.get("params", {})
    check_value(params, f"{where}.params")
    defaults = defaults or {}
    priority = raw.get("priority")
    deadline = raw.get("deadline")
    return TaskSpec(
        model=raw["model"],
        params=params,
        force=raw.get("force", False),
        ref=raw.get("ref"),
        priority=priority if priority is not None else defaults.get("priority") or 0,
        deadline=parse_deadline(
            deadline if deadline is not None else defaults.get("deadline"), where
        ),
        deadline_action=raw.get("deadline_action") or defaults.get("deadline_action") or "run",
        fallbacks=tuple(m for m in dict.fromkeys(raw.get("models") or ()) if m != raw["model"]),
    )


def parse_spec(raw: Any, where: str = "task") -> TaskSpec:
    """A task body from JSON into a TaskSpec, or an InputError saying what is wrong."""
    _validated("TaskBody", raw, where)
    return _spec(raw, where)


def parse_job(raw: Any) -> tuple[str, list[TaskSpec]]:
    """A job body into its name and tasks, or an InputError naming the field
    (``tasks[3].model``)."""
    try:
        _validated("JobBody", raw, "job")
    except InputError as exc:
        # A task's field is named as in batch files and ledger errors: tasks[3].model
        raise InputError(str(exc).replace("job.tasks[", "tasks[", 1)) from None
    name = raw["name"].strip()
    if not name:  # str.strip() knows a few more spaces than the schema's \S
        raise InputError("job.name must be a non-empty string")
    tasks = raw["tasks"]
    defaults = {key: raw.get(key) for key in ("priority", "deadline", "deadline_action")}
    return name, [_spec(task, f"tasks[{i}]", defaults) for i, task in enumerate(tasks)]


def parse_plan(raw: Any) -> tuple[list[TaskSpec], float | None, float | None]:
    """A plan body: its tasks, the cost limit and the deadline (epoch seconds)."""
    _validated("PlanBody", raw, "plan")
    specs = [_spec(task, f"tasks[{i}]") for i, task in enumerate(raw["tasks"])]
    return specs, raw.get("max_cost_usd"), parse_deadline(raw.get("deadline"), "plan")
