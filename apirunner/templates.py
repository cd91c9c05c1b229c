"""Profiles describe requests as templates; this renders them. Pure functions.

Body templates (SPEC "Profiles"): a string that is exactly ``"{name}"`` is
replaced by the task's parameter with its JSON type (a number stays a number);
a parameter the task lacks removes the key (or the list element), so the
provider applies its own default instead of receiving ``null``. Strings with
other text around placeholders are formatted; a missing parameter there
removes the key too, for the same reason. ``{{`` and ``}}`` are literal braces.
Only bare identifiers are placeholders: no attribute or index access, so a
profile can never reach into Python objects the way ``str.format`` could.
A placeholder may carry a form, ``{reference_image:data_url}``: it reads the
value the caller prepared under ``"reference_image:data_url"`` (the runner
turns images into data URLs, base64 or upload ids before rendering; see
`placeholders` for finding which forms a template needs).

Dotted paths (``choices.0.message.content``, or ``choices[0]...``) walk dicts by key and lists by
integer index. `walk` stops early at a URL string when segments remain, so the
caller can fetch that URL and carry on inside its answer (fal's
``response_url.images.0.url``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit


class _Missing:
    _instance: _Missing | None = None

    def __new__(cls) -> _Missing:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "MISSING"

    def __bool__(self) -> bool:
        return False


MISSING: Final = _Missing()

# A placeholder is a bare identifier, optionally with a form after a colon
# (``{reference_image:data_url}``): the form names a rendering of the
# parameter that the caller supplies under the key ``"name:form"``.
_NAME = r"[A-Za-z_][A-Za-z0-9_]*(?::[A-Za-z_][A-Za-z0-9_]*)?"
_TOKEN = re.compile(r"\{\{|\}\}|\{(" + _NAME + r")\}")
_WHOLE = re.compile(r"\{(" + _NAME + r")\}")


class TemplateError(ValueError):
    """A path or URL template names a value the task does not have."""


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or value is None or isinstance(value, dict | list):
        return json.dumps(value)
    return str(value)


def render_text(template: str, params: Mapping[str, Any]) -> str | _Missing:
    """Format placeholders inside a string; MISSING when one has no value."""
    missing = False

    def sub(match: re.Match[str]) -> str:
        nonlocal missing
        token = match.group(0)
        if token == "{{":
            return "{"
        if token == "}}":
            return "}"
        name = match.group(1)
        if name not in params or params[name] is None:
            missing = True
            return ""
        return _as_text(params[name])

    rendered = _TOKEN.sub(sub, template)
    return MISSING if missing else rendered


def render_value(template: Any, params: Mapping[str, Any]) -> Any:
    """One template value rendered; MISSING means "leave this key out"."""
    if isinstance(template, str):
        whole = _WHOLE.fullmatch(template)
        if whole:
            name = whole.group(1)
            value = params.get(name)
            return MISSING if value is None else value
        return render_text(template, params)
    if isinstance(template, Mapping):
        return render_body(template, params)
    if isinstance(template, list | tuple):
        rendered = (render_value(item, params) for item in template)
        return [item for item in rendered if item is not MISSING]
    return template


def render_body(template: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in template.items():
        rendered = render_value(value, params)
        if rendered is not MISSING:
            out[key] = rendered
    return out


def placeholders(template: Any) -> set[tuple[str, str]]:
    """Every ``(name, form)`` a body template mentions; form is "" when bare."""
    found: set[tuple[str, str]] = set()
    if isinstance(template, str):
        for match in _TOKEN.finditer(template):
            if match.group(1):
                name, _, form = match.group(1).partition(":")
                found.add((name, form))
    elif isinstance(template, Mapping):
        for value in template.values():
            found |= placeholders(value)
    elif isinstance(template, list | tuple):
        for item in template:
            found |= placeholders(item)
    return found


def format_path(template: str, values: Mapping[str, Any]) -> str:
    """A URL path with each placeholder percent-encoded as one path segment.

    Encoding keeps a remote id or a parameter from smuggling in ``/``, ``?``
    or ``..`` and so changing which endpoint is called."""

    def sub(match: re.Match[str]) -> str:
        token = match.group(0)
        if token in ("{{", "}}"):
            return token[0]
        name = match.group(1)
        if name not in values or values[name] is None:
            raise TemplateError(f"path {template!r} needs {{{name}}}, which the task lacks")
        segment = quote(_as_text(values[name]), safe="")
        if not segment:
            raise TemplateError(f"path {template!r}: {{{name}}} is empty")
        if set(segment) == {"."}:
            # quote() leaves dots alone, and "." or ".." is a step in the path.
            segment = segment.replace(".", "%2E")
        return segment

    return _TOKEN.sub(sub, template)


def join_url(base_url: str, path: str) -> str:
    return base_url.rstrip("/") + "/" + path.lstrip("/")


def with_query(url: str, extra: Mapping[str, str]) -> str:
    """`url` with `extra` query parameters set (replacing any of the same name)."""
    parts = urlsplit(url)
    kept = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k not in extra]
    return urlunsplit(parts._replace(query=urlencode([*kept, *extra.items()])))


def is_url(value: Any) -> bool:
    return isinstance(value, str) and value.startswith(("http://", "https://"))


@dataclass(frozen=True)
class Walk:
    value: Any  # MISSING when the path does not exist
    rest: tuple[str, ...] = ()  # segments left after stopping at a URL string


_INDEX = re.compile(r"\[(\d+)\]")


def split_path(path: str) -> tuple[str, ...]:
    """``output[0].url`` and ``output.0.url`` are the same path."""
    return tuple(part for part in _INDEX.sub(r".\1", path).split(".") if part)


def walk(doc: Any, segments: Sequence[str]) -> Walk:
    current = doc
    for index, segment in enumerate(segments):
        if is_url(current):
            return Walk(current, tuple(segments[index:]))
        if isinstance(current, Mapping):
            if segment not in current:
                return Walk(MISSING)
            current = current[segment]
        elif isinstance(current, list):
            try:
                current = current[int(segment)]
            except (ValueError, IndexError):
                return Walk(MISSING)
        else:
            return Walk(MISSING)
    return Walk(current)


def lookup(doc: Any, path: str) -> Any:
    """The value at a dotted path, or MISSING; never follows URLs."""
    found = walk(doc, split_path(path))
    return MISSING if found.rest else found.value
