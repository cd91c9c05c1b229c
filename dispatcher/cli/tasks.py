"""Task and job commands: submit, batch, status, cancel, retry."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

import typer
from rich.markup import escape
from rich.table import Table

from dispatcher.batchfile import BatchLine, locate, read_batch_lines
from dispatcher.cli.output import (
    STATES,
    JsonFlag,
    console,
    err,
    error_text,
    fmt_seconds,
    print_json,
    result_text,
    styled,
)
from dispatcher.cli.plumbing import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    fail,
    handled,
    service_client,
)
from dispatcher.cli.progress import (
    LaneNames,
    describe_end,
    failures_table,
    job_table,
    summary,
    wait_task,
    watch_job,
)
from dispatcher.client import ApiError, Client
from dispatcher.errors import InputError


def _params(prompt: str, items: list[str]) -> dict[str, Any]:
    params: dict[str, Any] = {"prompt": prompt}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            fail(f"--param takes KEY=VALUE, got {item!r}", EXIT_USAGE)
        try:
            params[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            params[key.strip()] = value
    return params


def submit(
    model: Annotated[str, typer.Argument(help="Model name (a profile).")],
    prompt: Annotated[str, typer.Argument(help="The prompt.")],
    param: Annotated[
        list[str] | None,
        typer.Option("--param", "-p", help="KEY=VALUE, repeatable (JSON values parsed)."),
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Bypass de-duplication and the cache.")
    ] = False,
    wait: Annotated[
        bool, typer.Option("--wait", help="Show progress until the task ends.")
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Submit one task and print its id.

    With --wait, show its progress until it ends; the exit code is 1 unless it succeeds.
    """
    body = {"model": model, "params": _params(prompt, param or []), "force": force}
    with service_client() as client:
        task = client.post("/v1/tasks", body)
        if task["deduped"]:
            err.print(f"deduped: an identical task was submitted moments ago ({task['state']})")
        elif task["from_cache"]:
            err.print("answered from the result cache")
        if not as_json:
            sys.stdout.write(f"{task['id']}\n")
            sys.stdout.flush()
        if wait:
            task = wait_task(client, task, quiet=as_json)
    if as_json:
        print_json(task)
    elif wait:
        describe_end(task)
    if wait and task["state"] != "success":
        raise typer.Exit(EXIT_FAILED)


def batch(
    file: Annotated[Path, typer.Argument(help="JSONL or CSV of tasks.")],
    name: Annotated[str | None, typer.Option(help="Job name (default: the file name).")] = None,
    detach: Annotated[bool, typer.Option("--detach", help="Print the job id and return.")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Submit a JSONL/CSV batch as one job; watch it.

    Shows live progress per lane and overall (counts, ETA, failures as they
    happen), then a summary; the exit code is 1 if any task failed or was canceled.
    """
    with handled():
        lines = read_batch_lines(file)
    with service_client() as client:
        job = create_job(client, name or file.stem, file, lines)
        if detach:
            if as_json:
                print_json(job)
            else:
                sys.stdout.write(f"{job['id']}\n")
            return
        if not as_json:
            console.print(f"job {job['id']}: {job['total']} tasks from {escape(str(file))}")
        try:
            job = watch_job(client, job["id"], as_json=as_json)
        except KeyboardInterrupt:
            err.print(
                f"stopped watching; job {job['id']} keeps running "
                f"(python -m dispatcher status {job['id']}, or cancel {job['id']})"
            )
            raise typer.Exit(EXIT_INTERRUPTED) from None
    if as_json:
        print_json(job)
    else:
        summary(job, console)
    if job["counts"]["failed"] or job["counts"]["canceled"]:
        raise typer.Exit(EXIT_FAILED)


def create_job(client: Client, name: str, file: Path, lines: list[BatchLine]) -> dict[str, Any]:
    try:
        job: dict[str, Any] = client.post(
            "/v1/jobs", {"name": name, "tasks": [line.task for line in lines]}
        )
    except ApiError as exc:
        if exc.status == 400:
            raise InputError(locate(str(exc), file, lines)) from exc
        raise
    return job


def _task_table(task: dict[str, Any]) -> Table:
    table = Table(show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")
    rows: list[tuple[str, str]] = [
        ("task", task["id"]),
        ("job", task.get("job_id") or "-"),
        ("model", f"{task['model']} ({task['kind']})"),
        ("lane", f"{task['kind']}:{task['account']}" if task.get("account") else "-"),
        (
            "state",
            task["state"]
            + (
                " (cancel requested)"
                if task.get("cancel_requested") and task["state"] == "running"
                else ""
            ),
        ),
        ("stage", task.get("stage") or "-"),
        ("attempt", f"{task['attempt']}/{task['max_attempts']}"),
    ]
    if task["state"] == "pending":
        rows.append(("ahead", str(task.get("ahead", 0))))
    if task["state"] in ("pending", "running"):
        rows.append(("eta", fmt_seconds(task.get("eta_s"))))
    if task.get("progress") is not None:
        rows.append(("progress", f"{task['progress']:.0f}%"))
    if task.get("error"):
        rows.append(("error", error_text(task)))
    if task["state"] == "success":
        cached = " (from cache)" if task.get("from_cache") else ""
        rows.append(("result", result_text(task) + cached))
    if task.get("stage_durations"):
        stages = task["stage_durations"].items()
        rows.append(("stages", ", ".join(f"{k} {v:.1f}s" for k, v in stages)))
    for key, label in (
        ("created_at", "created"),
        ("started_at", "started"),
        ("finished_at", "finished"),
    ):
        if task.get(key):
            rows.append((label, time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(task[key]))))
    for field, value in rows:
        table.add_row(field, styled(value) if field == "state" else escape(value))
    return table


def status(
    task_or_job: Annotated[str, typer.Argument(metavar="ID", help="A task or job id.")],
    as_json: JsonFlag = False,
) -> None:
    """Show a task or a job."""
    with service_client() as client:
        kind, data = client.resolve(task_or_job)
        lanes = LaneNames(client.get("/v1/lanes")) if kind == "job" and not as_json else None
    if as_json:
        print_json(data)
    elif kind == "job":
        console.print(job_table(data, lanes))
        if data["counts"]["failed"]:
            console.print(failures_table(data))
    else:
        console.print(_task_table(data))


def _act(task_or_job: str, action: str, as_json: bool) -> None:
    with service_client() as client:
        kind, _ = client.resolve(task_or_job)
        data = client.post(f"/v1/{kind}s/{quote(task_or_job, safe='')}/{action}")
    if as_json:
        print_json(data)
    elif kind == "task":
        extra = f", attempt {data['attempt']}/{data['max_attempts']}" if action == "retry" else ""
        note = (
            " (cancel requested; it stops at its next checkpoint)"
            if (action == "cancel" and data["state"] == "running")
            else ""
        )
        console.print(f"task {data['id']}: {styled(data['state'])}{extra}{note}")
    else:
        counts = data["counts"]
        console.print(
            f"job {escape(data['name'])} {data['id']}: {styled(data['state'])} — "
            + ", ".join(f"{counts[s]} {s}" for s in STATES if counts[s])
        )


def cancel(
    task_or_job: Annotated[str, typer.Argument(metavar="ID", help="A task or job id.")],
    as_json: JsonFlag = False,
) -> None:
    """Cancel a task, or a job's pending and running tasks."""
    _act(task_or_job, "cancel", as_json)


def retry(
    task_or_job: Annotated[str, typer.Argument(metavar="ID", help="A task or job id.")],
    as_json: JsonFlag = False,
) -> None:
    """Retry a failed task, or a job's failed tasks.

    Tasks that succeeded are never run again.
    """
    _act(task_or_job, "retry", as_json)
