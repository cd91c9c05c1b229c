"""What ran: `jobs` and `tasks`, newest first, as tables or JSON pages."""

from __future__ import annotations

import time
from typing import Annotated, Any
from urllib.parse import urlencode

import typer
from rich.markup import escape
from rich.table import Table

from dispatcher.cli.output import (
    JsonFlag,
    console,
    error_text,
    fitted,
    fmt_seconds,
    print_json,
    result_text,
    styled,
)
from dispatcher.cli.plumbing import service_client

SHORT_ID_CHARS = 8  # enough to be unique in practice; every command takes a prefix
MAX_CELL_CHARS = 60

Limit = Annotated[
    int, typer.Option("--limit", "-n", min=1, max=500, help="How many, newest first.")
]
After = Annotated[
    str | None, typer.Option("--after", help="Go on from where a previous page ended.")
]
StateFilter = Annotated[
    str | None,
    typer.Option("--state", "-s", help="Only these states (comma-separated)."),
]


# Columns by how much a narrow terminal needs them (0 always shown; higher
# numbers go first as the width shrinks): ids stay whole rather than "fdfa…".
TASK_COLUMNS = (
    ("task", 0),
    ("ref", 0),
    ("job", 2),
    ("model", 0),
    ("state", 0),
    ("attempt", 1),
    ("lane", 3),
    ("created", 3),
    ("elapsed", 1),
    ("result or error", 0),
)
JOB_COLUMNS = (
    ("job", 0),
    ("name", 0),
    ("state", 0),
    ("done", 0),
    ("success", 2),
    ("failed", 0),
    ("canceled", 2),
    ("cost", 1),
    ("created", 1),
    ("elapsed", 1),
)
ID_COLUMNS = frozenset({"task", "job"})


def _table(columns: list[tuple[str, int]]) -> Table:
    table = Table(title_justify="left")
    for name, _ in columns:
        if name in ID_COLUMNS:
            table.add_column(name, no_wrap=True, min_width=SHORT_ID_CHARS)
        else:
            table.add_column(name, overflow="fold")
    return table


def short(value: str | None) -> str:
    return value[:SHORT_ID_CHARS] if value else "-"


def when(epoch_s: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch_s)) if epoch_s else "-"


def clip(text: str, limit: int = MAX_CELL_CHARS) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def task_elapsed_s(task: dict[str, Any]) -> float | None:
    """Run time: started to finished, or to now while it runs."""
    if not task.get("started_at"):
        return None
    end = task.get("finished_at") or (time.time() if task["state"] == "running" else None)
    return end - task["started_at"] if end else None


def _query(**params: Any) -> str:
    given = {k: v for k, v in params.items() if v is not None and v != ""}
    return urlencode(given)


def jobs(
    state: StateFilter = None,
    name: Annotated[
        str | None, typer.Option("--name", help="Only jobs whose name contains this.")
    ] = None,
    limit: Limit = 20,
    after: After = None,
    as_json: JsonFlag = False,
) -> None:
    """List jobs, newest first, with progress, created time and elapsed time."""
    with service_client(as_json) as client:
        page = client.get(f"/v1/jobs?{_query(state=state, q=name, limit=limit, after=after)}")
    if as_json:
        print_json(page)
        return
    columns = fitted(JOB_COLUMNS, console.width)
    table = _table(columns)
    for job in page["items"]:
        counts = job["counts"]
        done = counts["success"] + counts["failed"] + counts["canceled"]
        cached = f" ({job['from_cache']} cached)" if job.get("from_cache") else ""
        cells = {
            "job": short(job["id"]),
            "name": escape(clip(job["name"], 40)),
            "state": styled(job["state"]),
            "done": f"{done}/{job['total']}",
            "success": f"{counts['success']}{cached}",
            "failed": str(counts["failed"]),
            "canceled": str(counts["canceled"]),
            "cost": f"${job.get('cost_usd') or 0:,.2f}",
            "created": when(job["created_at"]),
            "elapsed": fmt_seconds(job.get("elapsed_s")),
        }
        table.add_row(*(cells[name] for name, _ in columns))
    _print_page(table, page, "jobs")


def tasks(
    job: Annotated[
        str | None, typer.Option("--job", "-j", help="Only this job's tasks (id or prefix).")
    ] = None,
    state: StateFilter = None,
    model: Annotated[str | None, typer.Option("--model", "-m", help="Only this model.")] = None,
    search: Annotated[
        str | None, typer.Option("--search", help="Only tasks whose prompt or ref has this.")
    ] = None,
    limit: Limit = 20,
    after: After = None,
    as_json: JsonFlag = False,
) -> None:
    """List tasks, newest first (single tasks and jobs' tasks alike)."""
    with service_client(as_json) as client:
        query = _query(job=job, state=state, model=model, q=search, limit=limit, after=after)
        page = client.get(f"/v1/tasks?{query}")
    if as_json:
        print_json(page)
        return
    columns = fitted(TASK_COLUMNS, console.width)
    table = _table(columns)
    for task in page["items"]:
        outcome = error_text(task) if task.get("error") else result_text(task)
        if task.get("from_cache"):
            outcome = f"(cache) {outcome}"
        cells = {
            "task": short(task["id"]),
            "ref": escape(task.get("ref") or "-"),
            "job": short(task.get("job_id")),
            "model": escape(task["model"]),
            "state": styled(task["state"]),
            "attempt": f"{task['attempt']}/{task['max_attempts']}",
            "lane": escape(f"{task['kind']}:{task['owner']}" if task.get("owner") else "-"),
            "created": when(task["created_at"]),
            "elapsed": fmt_seconds(task_elapsed_s(task)),
            "result or error": escape(clip(outcome)),
        }
        table.add_row(*(cells[name] for name, _ in columns))
    _print_page(table, page, "tasks")


def _print_page(table: Table, page: dict[str, Any], what: str) -> None:
    if not page["items"]:
        console.print(f"no {what}")
        return
    console.print(table)
    if page.get("next"):
        console.print(
            f"[dim]more {what} follow: the same command with --after {page['next']}[/dim]"
        )
