"""Strict JSON in, strict JSON out: the only JSON the service takes or gives.

Python's `json` is lenient where it hurts: it reads ``NaN`` and ``Infinity``
(and ``1e999`` as infinity), strings with lone surrogates (``"\\ud800"``),
which cannot be written back as UTF-8, integers of thousands of digits, and
nests until the interpreter's recursion limit. Any of those, once stored,
makes every later answer that contains it fail. So:

* `loads` reads a body or a line as RFC 8259 JSON with bounds (`MAX_DEPTH`,
  64-bit integers, finite numbers, UTF-8 text without lone surrogates) and
  raises `InputError` saying what is wrong;
* `check_value` applies the same bounds to a value parsed by someone else
  (a CSV cell, a batch line), naming where the bad value is;
* `dumps` writes strict JSON and never fails on a value that came back from
  storage: a row an older version wrote still serialises, with non-finite
  numbers as ``null`` and lone surrogates as U+FFFD;
* `storable_text` / `storable` make what a vendor or a page sent fit every
  store: PostgreSQL refuses a NUL in text, and neither store takes a lone
  surrogate, so both become U+FFFD (on SQLite too, so both read back alike).
  A client's NUL is refused instead (`loads`, `check_value`): a 400.

Kept free of heavy imports: the CLI uses it to check batch files.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from dispatcher.errors import InputError

MAX_DEPTH = 64
INT_MIN = -(2**63)
INT_MAX = 2**63 - 1
# Longest integer literal that can be within 64 bits ("-" and 19 digits):
# longer ones are refused before int() spends time on them.
_MAX_INT_CHARS = 20
_OPENERS = frozenset(b"[{")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
# A JSON string, escapes included; used to skip brackets inside strings.
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
# Only an escape can put a surrogate or a NUL into a string parsed from
# valid JSON (a raw control character is not JSON).
_SUSPECT_ESCAPE = re.compile(rb"\\u(?:[dD][89a-fA-F]|0000)")
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
REPLACEMENT = "\ufffd"


def _refuse_constant(name: str) -> Any:
    raise InputError(f"{name} is not JSON: send a finite number or null")


def _parse_int(text: str) -> int:
    value = int(text) if len(text) <= _MAX_INT_CHARS else None
    if value is None or not INT_MIN <= value <= INT_MAX:
        raise InputError(
            f"integer {text[:24]}{'...' if len(text) > 24 else ''} is out of range "
            "(integers must fit in 64 bits; send big numbers as strings)"
        )
    return value


def _parse_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise InputError(f"number {text[:24]} is too large to be a finite number")
    return value


def _depth(raw: bytes) -> int:
    """Deepest nesting of arrays and objects, brackets inside strings not counted."""
    if raw.count(b"[") + raw.count(b"{") <= MAX_DEPTH:
        return 0  # cannot be deeper than this: the common case costs two C scans
    depth = deepest = 0
    for byte in _STRING.sub(b"", raw).translate(None, _NOT_BRACKETS):
        if byte in _OPENERS:
            depth += 1
            deepest = max(deepest, depth)
        elif byte in (0x5D, 0x7D):  # ] }
            depth -= 1
    return deepest


def loads(raw: bytes | str, what: str = "request body") -> Any:
    """Parse strict, bounded JSON or raise `InputError` starting with `what`."""
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{what}: not valid UTF-8 (byte {exc.start})") from exc
    if _depth(data) > MAX_DEPTH:
        raise InputError(f"{what}: nests deeper than {MAX_DEPTH} levels")
    try:
        value = json.loads(
            text,
            parse_constant=_refuse_constant,
            parse_int=_parse_int,
            parse_float=_parse_float,
        )
    except InputError as exc:
        raise InputError(f"{what}: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise InputError(
            f"{what}: not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
        ) from exc
    except RecursionError as exc:  # the depth scan should have caught it first
        raise InputError(f"{what}: nests too deeply") from exc
    if _SUSPECT_ESCAPE.search(data):
        check_value(value, what)
    return value


def _check_scalar(value: Any) -> str | None:
    """What is wrong with a leaf value, or None."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return None if INT_MIN <= value <= INT_MAX else "integer out of 64-bit range"
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{value} is not a JSON number"
    if isinstance(value, str):
        if "\x00" in value:
            return "text holds a NUL character (\\u0000), which cannot be stored"
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return "text has a lone surrogate (not valid Unicode)"
        return None
    return f"{type(value).__name__} is not a JSON value"


def storable_text(text: str) -> str:
    """`text` with every NUL and lone surrogate replaced by U+FFFD."""
    if text.isascii() and "\x00" not in text:
        return text  # the common case: one C scan each
    return _UNSTORABLE.sub(REPLACEMENT, text)


def storable(value: Any) -> Any:
    """`storable_text` applied to every string (keys included) of a JSON-like value."""
    if isinstance(value, str):
        return storable_text(value)
    if isinstance(value, dict):
        return {
            storable_text(k) if isinstance(k, str) else k: storable(v) for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [storable(v) for v in value]
    return value


def check_value(value: Any, where: str) -> None:
    """Raise `InputError` naming the first place where `value` is not strict JSON."""
    stack: list[tuple[Any, str, int]] = [(value, where, 1)]
    while stack:
        item, path, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > MAX_DEPTH:
                raise InputError(f"{where}: nests deeper than {MAX_DEPTH} levels")
            if isinstance(item, dict):
                for key, child in item.items():
                    problem = _check_scalar(key) if isinstance(key, str) else "a key is not text"
                    if problem:
                        raise InputError(f"{path}: {problem} (in a key)")
                    stack.append((child, f"{path}.{key}", depth + 1))
            else:
                stack.extend((child, f"{path}[{i}]", depth + 1) for i, child in enumerate(item))
            continue
        problem = _check_scalar(item)
        if problem:
            raise InputError(f"{path}: {problem}")


def _sanitized(value: Any, depth: int = 0) -> Any:
    if depth > MAX_DEPTH * 4:
        return None  # only a row written before the bounds existed gets here
    if isinstance(value, dict):
        return {_sanitized(str(k), depth + 1): _sanitized(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_sanitized(v, depth + 1) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, str):
        return value.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    if value is None or isinstance(value, bool | int | float):
        return value
    return str(value)


def _dump(value: Any) -> bytes:
    text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return text.encode("utf-8")


def dump_bytes(value: Any) -> bytes:
    """Compact strict JSON in UTF-8; what cannot be written strictly is replaced.

    Never raises for a value read back from storage: an answer must not fail
    because one row holds something an older version let in.
    """
    try:
        return _dump(value)
    except (ValueError, TypeError, RecursionError, UnicodeEncodeError):
        return _dump(_sanitized(value))


def dumps(value: Any) -> str:
    """`dump_bytes` as text."""
    return dump_bytes(value).decode("utf-8")
