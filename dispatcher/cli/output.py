"""What the commands print: the consoles, JSON output and the shared formatting."""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any

import typer
from rich.console import Console

console = Console(highlight=False)
err = Console(stderr=True, highlight=False, soft_wrap=True)

JsonFlag = Annotated[bool, typer.Option("--json", help="Machine-readable output on stdout.")]
STATES = ("pending", "running", "success", "failed", "canceled")
STATE_STYLE = {
    "pending": "dim",
    "running": "cyan",
    "success": "green",
    "failed": "red",
    "canceled": "yellow",
    "partial": "magenta",
}


# The widest a terminal may be and still leave out a table's columns of this
# rank (0: always shown; higher ranks go first as the width shrinks).
LEAVE_OUT_BELOW = {1: 90, 2: 110, 3: 140}


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2) + "\n")
    sys.stdout.flush()


def styled(state: str) -> str:
    style = STATE_STYLE.get(state, "")
    return f"[{style}]{state}[/{style}]" if style else state


def fmt_seconds(value: float | None) -> str:
    if value is None:
        return "-"
    seconds = max(0, round(value))
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    return f"{minutes // 60}h{minutes % 60:02d}m"


def error_text(task: dict[str, Any]) -> str:
    error = task.get("error") or {}
    return f"{error.get('kind')}: {error.get('message')}" if error else ""


def result_text(task: dict[str, Any]) -> str:
    result = task.get("result") or {}
    if result.get("files"):
        return ", ".join(
            f"{f.get('name') or f.get('path')} ({f.get('size')} bytes)" for f in result["files"]
        )
    text = str(result.get("text") or "")
    return text if len(text) <= 300 else text[:300] + "…"


def fitted(columns: tuple[tuple[str, int], ...], width: int) -> list[tuple[str, int]]:
    """The columns a terminal this wide shows."""
    return [(n, rank) for n, rank in columns if rank == 0 or width >= LEAVE_OUT_BELOW[rank]]
