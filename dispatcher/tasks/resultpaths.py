"""Result file paths as stored (relative to the results root) and as served (real).

The database keeps each result file's path relative to the results dir, so a
back-up restored into another state dir (or a results dir mounted elsewhere)
still finds every file. Rows an older version wrote hold absolute paths:
they are read as they are while the file is there, else re-rooted at the
task's own folder under the current results dir, so no migration is needed.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from dispatcher.models import JSON


def _files(result: Mapping[str, Any]) -> list[Any]:
    files = result.get("files")
    return files if isinstance(files, list) else []


def stored_result(result: JSON, results_dir: Path | None) -> JSON:
    """`result` with each file under `results_dir` named relative to it (a copy)."""
    files = _files(result)
    if results_dir is None or not files:
        return result
    root = results_dir.absolute()
    out: list[Any] = []
    for meta in files:
        if isinstance(meta, dict) and isinstance(meta.get("path"), str):
            path = Path(meta["path"])
            if path.is_absolute() and path.is_relative_to(root):
                meta = {**meta, "path": path.relative_to(root).as_posix()}
        out.append(meta)
    return {**result, "files": out}


def real_path(stored: str, results_dir: Path, task_id: str) -> Path:
    """Where a stored result path is on this disk now.

    A relative path lies under the results dir. An absolute one (an older
    row) is taken as it is when the file is there, else from the task's own
    folder on (`<old root>/<task id>/...`), under the results dir.
    """
    path = Path(stored)
    if not path.is_absolute():
        # Never above the results dir, whatever the row says.
        parts = [p for p in PurePosixPath(stored).parts if p not in ("..", ".")]
        return results_dir.joinpath(*parts)
    if path.exists() or task_id not in path.parts:
        return path
    tail = path.parts
    at = len(tail) - 1 - tail[::-1].index(task_id)
    moved = results_dir.joinpath(*tail[at:])
    return moved if moved.exists() else path


def real_result(result: JSON, results_dir: Path, task_id: str) -> JSON:
    """`result` with every file path where the file is on this disk (a copy)."""
    files = _files(result)
    if not files:
        return result
    out: list[Any] = []
    for meta in files:
        if isinstance(meta, dict) and isinstance(meta.get("path"), str):
            meta = {**meta, "path": str(real_path(meta["path"], results_dir, task_id))}
        out.append(meta)
    return {**result, "files": out}
