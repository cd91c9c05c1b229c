"""The remote job: what `remote_id` stores, and what a status answer means.

Pure functions.

`remote_id` is what a restarted dispatcher needs to resume without
resubmitting:

- Providers whose every URL is rebuilt from the id (OpenAI videos:
  ``/v1/videos/{id}``) store the bare id.
- Providers that hand back URLs to use as given (fal's ``status_url``,
  ``response_url``, ``cancel_url``) store a JSON object string
  ``{"id": "<id>", "submit": <the submit answer>}``; every `url = "..."`
  dotted path of the profile resolves against that stored answer after a
  restart exactly as it did before.
- ComfyUI servers (style ``comfyui``, `apirunner.comfyui`) store the bare
  ``prompt_id``: every later call (/history, /queue, /interrupt) names it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from apirunner.templates import MISSING, lookup
from dispatcher.profile_calls import StatusSpec
from dispatcher.profiles import ApiSpec

# A remote id names one job and becomes one path segment: bounded, printable,
# no separators, not "." or "..".
MAX_REMOTE_ID_CHARS = 256
_BAD_ID_CHARS = re.compile(r"[/\\\x00-\x1f\x7f-\x9f]")


class RemoteIdRefused(ValueError):
    """A submit answer named its job with an id we will not put in a URL."""


def check_remote_id(value: str) -> str:
    """The id, or RemoteIdRefused saying why it could change which endpoint is called."""
    shown = repr(value[:40]) + ("..." if len(value) > 40 else "")
    if not value or not value.strip():
        raise RemoteIdRefused("the submit answer names the job with an empty id")
    if len(value) > MAX_REMOTE_ID_CHARS:
        raise RemoteIdRefused(
            f"the submit answer's job id is longer than {MAX_REMOTE_ID_CHARS} characters"
        )
    if set(value) == {"."}:
        raise RemoteIdRefused(f"the submit answer's job id {shown} is only dots")
    if _BAD_ID_CHARS.search(value):
        raise RemoteIdRefused(
            f"the submit answer's job id {shown} holds a slash, a backslash or a control character"
        )
    return value


RemoteState = Literal["pending", "running", "success", "failed", "canceled"]
TERMINAL: frozenset[RemoteState] = frozenset({"success", "failed", "canceled"})

# Used when a profile's `map` does not name a state: the words providers use.
_COMMON_STATES: dict[str, RemoteState] = {
    "queued": "pending",
    "in_queue": "pending",
    "pending": "pending",
    "starting": "pending",
    "submitted": "pending",
    "in_progress": "running",
    "running": "running",
    "processing": "running",
    "generating": "running",
    "completed": "success",
    "complete": "success",
    "succeeded": "success",
    "success": "success",
    "done": "success",
    "failed": "failed",
    "failure": "failed",
    "error": "failed",
    "errored": "failed",
    "canceled": "canceled",
    "cancelled": "canceled",
    "cancellation_requested": "canceled",
}


@dataclass(frozen=True)
class RemoteRef:
    id: str
    submit: dict[str, Any] | None = field(default=None)  # kept only for URL-returning providers

    def encode(self) -> str:
        if self.submit is None:
            return self.id
        return json.dumps({"id": self.id, "submit": self.submit}, sort_keys=True)

    @classmethod
    def decode(cls, stored: str) -> RemoteRef:
        if stored.startswith("{"):
            try:
                data = json.loads(stored)
            except ValueError:
                data = None
            if isinstance(data, dict) and isinstance(data.get("id"), str):
                submit = data.get("submit")
                return cls(data["id"], submit if isinstance(submit, dict) else None)
        return cls(stored)


def uses_returned_urls(api: ApiSpec) -> bool:
    """Whether any later call reads a URL out of the submit answer."""
    return bool(
        (api.status is not None and api.status.url)
        or (api.result is not None and api.result.url)
        or (api.cancel is not None and api.cancel.url)
    )


def ref_from_submit(api: ApiSpec, answer: Any) -> RemoteRef | None:
    """The remote job named by a submit answer; None when the answer names none.

    Raises RemoteIdRefused for an id that could change a URL's path.
    """
    keep = answer if isinstance(answer, dict) and uses_returned_urls(api) else None
    if api.submit.id:
        value = lookup(answer, api.submit.id)
        if value is MISSING or value is None or isinstance(value, dict | list) or value == "":
            return None
        text = str(value)
        if api.submit.id_last_segment:
            text = text.rstrip("/").rpartition("/")[2]
        return RemoteRef(check_remote_id(text), keep)
    if keep is None:
        return None
    # No id field but URLs to follow: the status URL itself identifies the job.
    status_url = lookup(answer, api.status.url) if api.status and api.status.url else MISSING
    if not isinstance(status_url, str) or not status_url:
        return None
    return RemoteRef(status_url, keep)


@dataclass(frozen=True)
class RemoteStatus:
    state: RemoteState
    raw_state: str
    progress: float | None = None  # percent, 0..100
    queue_position: int | None = None
    error: str | None = None

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def _text(value: Any) -> str | None:
    if value is MISSING or value is None:
        return None
    if isinstance(value, str):
        return value
    return json.dumps(value)


def _state_word(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def interpret_status(spec: StatusSpec, answer: Any) -> RemoteStatus:
    """Read one status answer through the profile's paths and state map.

    A state the profile's map and the common words do not know is taken as
    still running: polling on (until the task's timeout) is the safe reading
    of a provider that added a new intermediate state.
    """
    raw = lookup(answer, spec.state)
    # A boolean state (`done: true`) reads as "true"/"false", as a map's keys say it.
    raw_state = "" if raw is MISSING or raw is None else _state_word(raw)
    state: RemoteState = spec.map.get(raw_state) or _COMMON_STATES.get(raw_state.lower(), "running")
    progress = _number(lookup(answer, spec.progress)) if spec.progress else None
    if progress is not None:
        progress = min(100.0, max(0.0, progress))
    position = _number(lookup(answer, spec.queue_position)) if spec.queue_position else None
    error = _text(lookup(answer, spec.error)) if spec.error else None
    if state == "success":
        for path in spec.failed_if:
            failure = lookup(answer, path)
            if failure not in (MISSING, None, "", [], {}, 0):
                state, error = "failed", error or _text(failure)
                break
    return RemoteStatus(
        state=state,
        raw_state=raw_state,
        progress=progress,
        queue_position=int(position) if position is not None and position >= 0 else None,
        error=error,
    )
