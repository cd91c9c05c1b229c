"""A task as a client states it, checked before anything is stored.

Kept free of heavy imports: the CLI checks batch files with it too, so a bad
line is reported with its line number before anything is sent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dispatcher.errors import InputError
from dispatcher.models import JSON
from dispatcher.strictjson import check_value


@dataclass(frozen=True)
class TaskSpec:
    model: str
    params: JSON = field(default_factory=dict)
    force: bool = False


def parse_spec(raw: Any, where: str = "task") -> TaskSpec:
    """A task body from JSON into a TaskSpec, or an InputError saying what is wrong."""
    if not isinstance(raw, dict):
        raise InputError(f"{where} must be a JSON object")
    unknown = set(raw) - {"model", "params", "force"}
    if unknown:
        raise InputError(f"{where} has unknown field(s): {', '.join(sorted(unknown))}")
    model = raw.get("model")
    if not isinstance(model, str) or not model:
        raise InputError(f"{where}.model must be a non-empty string")
    params = raw.get("params", {})
    if not isinstance(params, dict):
        raise InputError(f"{where}.params must be a JSON object")
    if "prompt" in params and not isinstance(params["prompt"], str):
        raise InputError(f"{where}.params.prompt must be a string")
    check_value(params, f"{where}.params")
    force = raw.get("force", False)
    if not isinstance(force, bool):
        raise InputError(f"{where}.force must be true or false")
    return TaskSpec(model=model, params=params, force=force)
