"""What the demo API provider reads off a request and how it words an error.

The vendors and operations (for quotas, stats and fault filters), API keys,
per-prompt directives like ``[fail=permanent]`` or ``[duration=2]``, nominal
durations, and error bodies shaped like the real vendors'.
"""

from __future__ import annotations

import math
import re
from typing import Any

from starlette.responses import JSONResponse

OPENAI, FAL = "openai", "fal"
OPERATIONS = ("chat", "submit", "poll", "result", "content", "cancel", "upload")
DIRECTIVE = re.compile(r"\[(\w+)=([^\]]*)\]")
PERMANENT_REASON = "moderation_blocked: the prompt was refused by the safety system"
TRANSIENT_REASON = "internal_error: the worker crashed, please try again"


def directives(text: str) -> dict[str, str]:
    return {k.lower(): v.strip() for k, v in DIRECTIVE.findall(text)}


def parse_seconds(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value) if math.isfinite(value) and value >= 0 else None
    if isinstance(value, str):
        try:
            return parse_seconds(float(value))
        except ValueError:
            return None
    return None


def nominal_duration(marks: dict[str, str], body: dict[str, Any], default: float) -> float:
    """Nominal generation seconds: a [duration=x] directive, else gen_s, else default."""
    for value in (marks.get("duration"), body.get("gen_s")):
        found = parse_seconds(value)
        if found is not None:
            return found
    return default


def error_response(status: int, message: str, code: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": code, "code": code}}, status)


def operation(method: str, path: str) -> tuple[str, str] | None:
    """(vendor, operation) of a request, for quotas, stats and fault filters."""
    parts = [p for p in path.split("/") if p]
    if parts[:2] == ["v1", "chat"]:
        return OPENAI, "chat"
    if parts[:2] == ["v1", "files"]:
        return OPENAI, "upload" if method == "POST" else "content"
    if parts[:2] == ["v1", "videos"]:
        if len(parts) == 2:
            return OPENAI, "submit"
        tail = parts[3] if len(parts) > 3 else ""
        return OPENAI, {"": "poll", "content": "content", "cancel": "cancel"}.get(tail, "poll")
    if parts[:1] == ["fal"]:
        if parts[1:2] == ["files"]:
            return FAL, "content"
        if parts[1:2] == ["requests"]:
            tail = parts[3] if len(parts) > 3 else ""
            return FAL, {"": "result", "status": "poll", "cancel": "cancel"}.get(tail, "poll")
        return FAL, "submit" if method == "POST" else "poll"
    return None


def api_key(headers: Any) -> str | None:
    value = str(headers.get("authorization", ""))
    scheme, _, token = value.partition(" ")
    if scheme.lower() in ("bearer", "key") and token.strip():
        return token.strip()
    return None
