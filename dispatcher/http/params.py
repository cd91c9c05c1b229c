"""The query parameters of the local API's listings: parsed strictly, each
bad one a 400 naming it (never a 500 from the store)."""

from __future__ import annotations

from typing import TypeVar

from starlette.requests import Request

from dispatcher.errors import InputError
from dispatcher.http.limits import MAX_LIST
from dispatcher.models import JSON, JobState, State

MAX_QUERY_CHARS = 200


def is_count(raw: str) -> bool:
    """ASCII digits only: str.isdigit() also takes "²", which int() refuses."""
    return raw.isascii() and raw.isdigit() and len(raw) <= 9


def limit_of(request: Request, default: int) -> int:
    raw = request.query_params.get("limit", str(default))
    if not is_count(raw) or not 1 <= int(raw) <= MAX_LIST:
        raise InputError(f"limit must be a whole number within 1..{MAX_LIST}")
    return int(raw)


def cursor_of(request: Request, name: str = "after") -> int | None:
    """`after`: the `next` of a previous page (opaque to clients; a seq here)."""
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 18:
        raise InputError(f"{name} must be the `next` value of a previous page")
    return int(raw)


_S = TypeVar("_S", State, JobState)


def states_of(request: Request, kind: type[_S]) -> list[_S]:
    raw = request.query_params.get("state", "")
    try:
        return list(dict.fromkeys(kind(name.strip()) for name in raw.split(",") if name.strip()))
    except ValueError as exc:
        raise InputError(
            f"state must be a comma-separated list of {', '.join(s.value for s in kind)}"
        ) from exc


def text_of(request: Request, name: str) -> str | None:
    value = request.query_params.get(name) or None
    if value is not None and len(value) > MAX_QUERY_CHARS:
        raise InputError(f"{name} is longer than {MAX_QUERY_CHARS} characters")
    return value


def page_of(items: list[JSON], seqs: list[int], limit: int) -> JSON:
    """One page of a listing; one item more than `limit` was read to know if more follow."""
    more = len(items) > limit
    return {"items": items[:limit], "next": str(seqs[limit - 1]) if more else None}
