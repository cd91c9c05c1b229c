"""Batch files (JSONL or CSV) into task bodies, with line numbers in every error."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from dispatcher.errors import InputError

# CSV columns that are not params: the rest become params (numbers parsed).
_CSV_TOP = {"model", "force"}


def _csv_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def read_batch(path: Path) -> list[dict[str, Any]]:
    try:
        raw = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror}") from exc
    tasks: list[dict[str, Any]] = []
    if path.suffix.lower() == ".csv":
        reader = csv.DictReader(raw.splitlines())
        if not reader.fieldnames or "model" not in reader.fieldnames:
            raise InputError(f"{path}: a CSV batch needs a header row with a `model` column")
        for number, row in enumerate(reader, start=2):
            model = (row.get("model") or "").strip()
            if not model:
                raise InputError(f"{path}:{number}: empty model")
            params = {
                k: _csv_value(v) if k != "prompt" else v
                for k, v in row.items()
                if k not in _CSV_TOP and k is not None and v not in (None, "")
            }
            task: dict[str, Any] = {"model": model, "params": params}
            if (row.get("force") or "").strip().lower() in {"1", "true", "yes"}:
                task["force"] = True
            tasks.append(task)
    else:
        for number, line in enumerate(raw.splitlines(), start=1):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            try:
                item = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InputError(f"{path}:{number}: not valid JSON: {exc.msg}") from exc
            if not isinstance(item, dict):
                raise InputError(f"{path}:{number}: each line must be a JSON object")
            tasks.append(item)
    if not tasks:
        raise InputError(f"{path}: no tasks in the file")
    return tasks
