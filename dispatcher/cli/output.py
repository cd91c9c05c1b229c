"""What the commands print: the consoles, JSON output and the shared formatting."""

from __future__ import annotations

import json
import os
import sys
from typing import Annotated, Any, TextIO

import typer
from rich.console import Console

# Piped or redirected (`| grep`, a file, a cron job's mail), a table's row
# stays one line: Rich would wrap it at the terminal's width (found on stdin
# even when stdout is a pipe) or at 80 columns, splitting a model's name or
# a file's name across lines where grep cannot find it. The pager or the
# terminal that shows it later wraps it. COLUMNS, when set, still decides.
PIPED_WIDTH = 4000


def _width(stream: TextIO | None) -> int | None:
    """The width to draw for `stream`; None: Rich's own choice."""
    if stream is None or os.environ.get("COLUMNS", "").isdigit():
        return None  # None: started with that descriptor closed
    try:
        return None if stream.isatty() else PIPED_WIDTH
    except ValueError:  # closed since
        return None


console = Console(highlight=False, width=_width(sys.stdout))
err = Console(stderr=True, highlight=False, soft_wrap=True, width=_width(sys.stderr))

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
