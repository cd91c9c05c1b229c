"""Batch files (JSONL or CSV) into task bodies, with line numbers in every error.

JSONL: one task per line, either the API's shape
``{"model": "demo-video", "params": {"prompt": "...", "gen_s": 2}, "force": false}``
or flat, where every key but ``model``, ``ref`` and ``force`` is a parameter:
``{"model": "demo-video", "ref": "shot-01", "prompt": "...", "gen_s": 2}``.
Blank lines and lines starting with ``#`` are skipped.

CSV: a header row with a ``model`` column; optional ``ref`` and ``force``
(true/false) columns; every other column is a parameter (JSON values such as
numbers are parsed, except ``prompt`` which stays text); empty cells are left out.

``ref`` is the client's name for a task (unique within the file); it names
the task's files when `dispatcher results` collects them. docs/batch-files.md
describes both formats for users.
"""

from __future__ import annotations

import csv
import io
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dispatcher import strictjson
from dispatcher.errors import InputError
from dispatcher.taskspec import parse_spec

_TOP = ("model", "params", "force", "ref")
_CSV_TOP = {"model", "force", "ref"}
_TRUE = {"1", "true", "yes", "y"}
_FALSE = {"", "0", "false", "no", "n"}
_TASK_INDEX = re.compile(r"\btasks\[(\d+)\]")


@dataclass(frozen=True)
class BatchLine:
    """One task of a batch file and the line it starts on."""

    line: int
    task: dict[str, Any]


def _csv_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _check(where: str, task: dict[str, Any]) -> dict[str, Any]:
    """The checks the service makes too, so that errors point at a line."""
    parse_spec(task, where)
    return task


def _jsonl(path: Path, raw: str) -> list[BatchLine]:
    lines: list[BatchLine] = []
    for number, line in enumerate(raw.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        where = f"{path}:{number}"
        item = strictjson.loads(line, where)
        if not isinstance(item, dict):
            raise InputError(f"{where}: each line must be a JSON object")
        if "params" in item:
            unknown = sorted(set(item) - set(_TOP))
            if unknown:
                raise InputError(
                    f"{where}: unknown field(s) {', '.join(unknown)} next to `params` "
                    "(put parameters inside `params`, or leave `params` out altogether)"
                )
            task = item
        else:
            task = {
                "model": item.get("model"),
                "params": {k: v for k, v in item.items() if k not in _CSV_TOP},
            }
            for key in ("force", "ref"):
                if key in item:
                    task[key] = item[key]
        lines.append(BatchLine(number, _check(where, task)))
    return _unique_refs(path, lines)


def _csv(path: Path, raw: str) -> list[BatchLine]:
    reader = csv.reader(io.StringIO(raw, newline=""))
    try:
        header = next(reader, None)
    except csv.Error as exc:
        raise InputError(f"{path}:1: {exc}") from exc
    names = [name.strip() for name in header or []]
    if "model" not in names:
        raise InputError(f"{path}:1: a CSV batch needs a header row with a `model` column")
    if len(set(names)) != len(names):
        raise InputError(f"{path}:1: a column name appears twice in the header")
    lines: list[BatchLine] = []
    while True:
        start = reader.line_num + 1
        where = f"{path}:{start}"
        try:
            row = next(reader)
        except StopIteration:
            break
        except csv.Error as exc:
            raise InputError(f"{where}: {exc}") from exc
        if not any(cell.strip() for cell in row):
            continue
        if len(row) > len(names):
            raise InputError(f"{where}: {len(row)} fields but the header names {len(names)}")
        cells = dict(zip(names, row, strict=False))
        params = {
            key: value if key == "prompt" else _csv_value(value)
            for key, value in cells.items()
            if key not in _CSV_TOP and key and value != ""
        }
        task: dict[str, Any] = {"model": cells.get("model", "").strip(), "params": params}
        force = cells.get("force", "").strip().lower()
        if force not in _TRUE | _FALSE:
            raise InputError(f"{where}: force must be true or false, not {force!r}")
        if force in _TRUE:
            task["force"] = True
        ref = cells.get("ref", "").strip()
        if ref:
            task["ref"] = ref
        lines.append(BatchLine(start, _check(where, task)))
    return _unique_refs(path, lines)


def _unique_refs(path: Path, lines: list[BatchLine]) -> list[BatchLine]:
    seen: dict[str, int] = {}
    for entry in lines:
        ref = entry.task.get("ref")
        if ref is None:
            continue
        if ref in seen:
            raise InputError(
                f"{path}:{entry.line}: ref {ref!r} is already used on line {seen[ref]}; "
                "refs are unique within a batch"
            )
        seen[ref] = entry.line
    return lines


def read_batch_lines(path: Path) -> list[BatchLine]:
    """The tasks of a batch file with their line numbers; InputError names file:line."""
    try:
        raw = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror}") from exc
    lines = _csv(path, raw) if path.suffix.lower() == ".csv" else _jsonl(path, raw)
    if not lines:
        raise InputError(f"{path}: no tasks in the file")
    return lines


def read_batch(path: Path) -> list[dict[str, Any]]:
    """The task bodies of a batch file, ready for `POST /v1/jobs`."""
    return [entry.task for entry in read_batch_lines(path)]


def locate(message: str, path: Path, lines: list[BatchLine]) -> str:
    """Rewrite the service's `tasks[i]` in an error message as `file:line`."""
    match = _TASK_INDEX.search(message)
    if match is None or int(match.group(1)) >= len(lines):
        return message
    line = lines[int(match.group(1))].line
    rest = message[match.end() :].lstrip(": ")
    return f"{path}:{line}: {rest}"
