"""Batch files (JSONL or CSV) into task bodies, with line numbers in every error.

JSONL: one task per line, either the API's shape
``{"model": "demo-video", "params": {"prompt": "...", "gen_s": 2}, "force": false}``
or flat, where every key but ``model``, ``ref``, ``force``, ``priority``, ``deadline``
and ``deadline_action``, ``models`` is a parameter:
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
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dispatcher import strictjson
from dispatcher.errors import InputError
from dispatcher.http.limits import MAX_JOB_BODY_BYTES, MAX_JOB_TASKS
from dispatcher.tasks.inputfiles import read_regular_file, size_text
from dispatcher.tasks.spec import parse_spec

# Scheduling fields of a task (issue 30), beside `force` and `ref` in JSONL.
_SCHEDULING = ("priority", "deadline", "deadline_action", "models")
_TOP = ("model", "params", "force", "ref", *_SCHEDULING)
_CSV_TOP = {"model", "force", "ref"}
_TRUE = {"1", "true", "yes", "y"}
_FALSE = {"", "0", "false", "no", "n"}
_TASK_INDEX = re.compile(r"\btasks\[(\d+)\]")
# Bad lines listed in one run; the rest are counted, so a wholly wrong file
# (the wrong format, say) does not print thousands of lines.
MAX_LISTED_PROBLEMS = 50
# What csv says, as the operator would put it.
_CSV_WHY = {
    "unexpected end of data": (
        "a quoted cell that starts in this row is never closed: "
        "the rest of the file would be read as one cell"
    ),
    "',' expected after '\"'": (
        "a quoted cell must end with a quote right before a comma or the end of the "
        "line (a stray or unclosed quote)"
    ),
}


@dataclass(frozen=True)
class BatchLine:
    """One task of a batch file and the line it starts on."""

    line: int
    task: dict[str, Any]


class _Found:
    """The tasks of a file so far and every problem, each naming its line."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lines: list[BatchLine] = []
        self.problems: list[str] = []
        self._refs: dict[str, int] = {}
        self._rows = 0

    def row(self, line: int) -> None:
        """Count one more row (good or bad); past the most a job takes, reading stops."""
        self._rows += 1
        if self._rows > MAX_JOB_TASKS:
            # What follows cannot be sent as one job anyway, and a file of a
            # million lines should not be parsed for a minute first.
            self.problems.append(
                f"{self.path}:{line}: task {MAX_JOB_TASKS + 1:,}: a job takes at most "
                f"{MAX_JOB_TASKS:,} tasks; split the file"
            )
            raise _Stop

    def add(self, line: int, task: dict[str, Any]) -> None:
        """One task, checked as the service would check it, so errors point at a line."""
        where = f"{self.path}:{line}"
        parse_spec(task, where)
        ref = task.get("ref")
        if ref is not None:
            if ref in self._refs:
                raise InputError(
                    f"{where}: ref {ref!r} is already used on line {self._refs[ref]}; "
                    "refs are unique within a batch"
                )
            self._refs[ref] = line
        self.lines.append(BatchLine(line, task))


class _Stop(Exception):
    """Reading the file ends here (the task limit)."""


def _csv_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _jsonl_task(where: str, line: str) -> dict[str, Any]:
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
        return item
    task = {
        "model": item.get("model"),
        "params": {k: v for k, v in item.items() if k not in _CSV_TOP and k not in _SCHEDULING},
    }
    for key in ("force", "ref", *_SCHEDULING):
        if key in item:
            task[key] = item[key]
    return task


def _jsonl(found: _Found, raw: str) -> None:
    for number, line in enumerate(raw.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        found.row(number)
        try:
            found.add(number, _jsonl_task(f"{found.path}:{number}", line))
        except InputError as exc:
            found.problems.append(str(exc))


def _csv_rows(found: _Found, raw: str) -> Iterator[tuple[int, list[str]]]:
    """(first line, cells) of each row; a malformed row is a problem, and reading goes on."""
    # strict: an unclosed quote is an error, not a cell that swallows the rows after it.
    reader = csv.reader(io.StringIO(raw, newline=""), strict=True)
    while True:
        start = reader.line_num + 1
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            if start > 1:  # the header is no task
                found.row(start)
            why = _CSV_WHY.get(str(exc), str(exc))
            end = f" (the row runs to line {reader.line_num})" if reader.line_num > start else ""
            found.problems.append(f"{found.path}:{start}: {why}{end}")
            continue
        if start > 1:
            if not any(cell.strip() for cell in row):
                continue
            found.row(start)
        yield start, row


def _csv_task(where: str, names: list[str], row: list[str]) -> dict[str, Any]:
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
    return task


def _csv(found: _Found, raw: str) -> None:
    rows = _csv_rows(found, raw)
    first = next(rows, None)
    if first is None or found.problems:
        raise _Stop  # the header row itself is broken: nothing below can be read
    names = [name.strip() for name in first[1]]
    if "model" not in names:
        raise InputError(f"{found.path}:1: a CSV batch needs a header row with a `model` column")
    if len(set(names)) != len(names):
        raise InputError(f"{found.path}:1: a column name appears twice in the header")
    for start, row in rows:
        try:
            found.add(start, _csv_task(f"{found.path}:{start}", names, row))
        except InputError as exc:
            found.problems.append(str(exc))


def _decode(path: Path, raw: bytes) -> str:
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise InputError(
            f"{path}:{line}: not UTF-8 text ({exc.reason} at byte {exc.start})"
        ) from exc


def _check_body_size(found: _Found) -> None:
    """The job body the CLI will send must fit the service's limit (CSV grows as JSON)."""
    # Counted as the client encodes it: json.dumps with its default separators.
    size = len('{"name": "", "tasks": []}')
    for entry in found.lines:
        size += len(json.dumps(entry.task).encode()) + 2
        if size > MAX_JOB_BODY_BYTES:
            found.problems.append(
                f"{found.path}:{entry.line}: the tasks up to this line pass "
                f"{size_text(MAX_JOB_BODY_BYTES)} as one job, the most the service "
                "takes in one request; split the file here"
            )
            return


def _report(path: Path, problems: list[str]) -> str:
    listed = problems[:MAX_LISTED_PROBLEMS]
    more = len(problems) - len(listed)
    tail = [f"... and {more} more"] if more else []
    if len(problems) == 1:
        return problems[0]
    return "\n".join([f"{len(problems)} problems in {path}; nothing was sent:", *listed, *tail])


def read_batch_lines(path: Path) -> list[BatchLine]:
    """The tasks of a batch file with their line numbers.

    Every bad line is reported in one InputError (file:line each); nothing of
    a file with any bad line is sent.
    """
    raw = _decode(path, read_regular_file(path, MAX_JOB_BODY_BYTES, "a batch file"))
    found = _Found(path)
    try:
        if path.suffix.lower() == ".csv":
            _csv(found, raw)
        else:
            _jsonl(found, raw)
    except _Stop:
        pass
    if not found.problems:
        _check_body_size(found)
    if found.problems:
        raise InputError(_report(path, found.problems))
    if not found.lines:
        raise InputError(f"{path}: no tasks in the file")
    return found.lines


def locate(message: str, path: Path, lines: list[BatchLine]) -> str:
    """Rewrite the service's `tasks[i]` in an error message as `file:line`."""
    match = _TASK_INDEX.search(message)
    if match is None or int(match.group(1)) >= len(lines):
        return message
    line = lines[int(match.group(1))].line
    rest = message[match.end() :].lstrip(": ")
    return f"{path}:{line}: {rest}"
