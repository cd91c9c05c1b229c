"""A task as the tests build one: an API task of model `m`, fields as given."""

from __future__ import annotations

from typing import Any

from dispatcher.models import Kind, Task


def api_task(task_id: str, *, queue: str = "g", **fields: Any) -> Task:
    """A task of model `m` in `queue`, its prompt and fingerprint from its id."""
    values: dict[str, Any] = {
        "model": "m",
        "kind": Kind.API,
        "queue": queue,
        "params": {"prompt": task_id},
        "fingerprint": f"fp-{task_id}",
        "created_at": 1.0,
        **fields,
    }
    return Task(id=task_id, **values)
