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
from dispatcher.cli.plan import Deadline, MaxCost, check_limits, deadline_of
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
from dispatcher.cli.service_client import ApiError, Client
from dispatcher.errors import InputError
from dispatcher.invocation import cli_command
from dispatcher.tasks.batchfile import BatchLine, locate, read_batch_lines


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
    ref: Annotated[
        str | None, typer.Option("--ref", help="Your name for it (names its result files).")
    ] = None,
    wait: Annotated[
        bool, typer.Option("--wait", help="Show progress until the task ends.")
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Submit one task and print its id.

    With --wait, show its progress until it ends; the exit code is 1 unless it succeeds.
    """
    body: dict[str, Any] = {"model": model, "params": _params(prompt, param or []), "force": force}
    if ref is not None:
        body["ref"] = ref
    with service_client(as_json) as client:
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
    force: Annotated[
        bool,
        typer.Option("--force", help="Run every task anew: bypass de-duplication and the cache."),
    ] = False,
    max_cost: MaxCost = None,
    deadline: Deadline = None,
    ignore_limits: Annotated[
        bool,
        typer.Option("--ignore-limits", help="Submit even when --max-cost/--deadline are unmet."),
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Submit a JSONL/CSV batch as one job; watch it.

    Shows live progress per lane and overall (counts, ETA, failures as they
    happen), then a summary; the exit code is 1 if any task failed or was canceled.
    With --max-cost or --deadline the batch is planned first (`dispatcher plan`)
    and refused, with the reason, when it cannot meet them.
    """
    with handled(as_json):
        lines = read_batch_lines(file)
        when = deadline_of(deadline)
    if force:
        lines = [BatchLine(line.line, {**line.task, "force": True}) for line in lines]
    with service_client(as_json) as client:
        if (max_cost is not None or when is not None) and not ignore_limits:
            check_limits(client, file, lines, max_cost, when, as_json=as_json)
        job = create_job(client, name or file.stem, file, lines, deadline=when)
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
                f"({cli_command()} status {job['id']}, or cancel {job['id']})"
            )
            raise typer.Exit(EXIT_INTERRUPTED) from None
    if as_json:
        print_json(job)
    else:
        summary(job, console)
    if job["counts"]["failed"] or job["counts"]["canceled"]:
        raise typer.Exit(EXIT_FAILED)


# How long the service may take to check, store and answer a job, per task:
# 10,000 tasks took 20 s on a loaded 2-core machine; the default 30 s would
# give up on a job the service then creates anyway.
JOB_TIMEOUT_S_PER_TASK = 0.01


def create_job(
    client: Client,
    name: str,
    file: Path,
    lines: list[BatchLine],
    *,
    deadline: float | None = None,
) -> dict[str, Any]:
    client.timeout_s = max(client.timeout_s, 30.0 + JOB_TIMEOUT_S_PER_TASK * len(lines))
    body: dict[str, Any] = {"name": name, "tasks": [line.task for line in lines]}
    if deadline is not None:
        body["deadline"] = deadline  # its tasks run earliest-deadline-first among equals
    try:
        job: dict[str, Any] = client.post("/v1/jobs", body)
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
        ("ref", task.get("ref") or "-"),
        ("job", task.get("job_id") or "-"),
        ("model", f"{task['model']} ({task['kind']})"),
        ("lane", f"{task['kind']}:{task['owner']}" if task.get("owner") else "-"),
        # With several hosts on one database, where it ran says where its files are.
        ("host", task.get("host") or "-"),
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
    # A fallback's models passed over before the one that ran it (issue 30).
    for skip in task.get("skipped") or []:
        rows.append(("skipped", f"{skip['model']}: {skip['reason']}"))
    if task["state"] == "pending":
        rows.append(("ahead", str(task.get("ahead", 0))))
    if task["state"] == "pending" and task.get("waiting"):
        rows.append(("eta", f"none: {task['waiting']}"))
    elif task["state"] in ("pending", "running"):
        rows.append(("eta", fmt_seconds(task.get("eta_s"))))
    if task.get("progress") is not None:
        rows.append(("progress", f"{task['progress']:.0f}%"))
    if task.get("error"):
        rows.append(("error", error_text(task)))
    # What a failed or cut-short attempt's page looked like (a logout bounce
    # too): the names, and the API path that serves them.
    for attempt, items in (task.get("artifacts") or {}).items():
        names = ", ".join(str(item["name"]) for item in items)
        where = f"/v1/tasks/{task['id']}/artifacts/{attempt}/<name>"
        rows.append(("evidence", f"attempt {attempt}: {names} ({where})"))
    if task["state"] == "success":
        cached = " (from cache)" if task.get("from_cache") else ""
        rows.append(("result", result_text(task) + cached))
        for meta in (task.get("result") or {}).get("files") or []:
            rows.append(("file", f"{meta.get('path')} ({meta.get('size')} bytes)"))
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


def _attempts_table(attempts: list[dict[str, Any]]) -> Table:
    table = Table(
        "attempt",
        "lane",
        "outcome",
        "started",
        "ended",
        "stages",
        "error",
        title="attempts",
        title_justify="left",
    )
    for attempt in attempts:
        stages = ", ".join(f"{k} {v:.1f}s" for k, v in attempt["stage_durations"].items())
        error = attempt.get("error") or {}
        table.add_row(
            str(attempt["attempt"]),
            escape(_attempt_lane(attempt)),
            styled(attempt["outcome"]),
            _clock_time(attempt.get("started_at")),
            _clock_time(attempt.get("ended_at")),
            escape(stages or "-"),
            escape(f"{error['kind']}: {error['message']}" if error else ""),
        )
    return table


def _attempt_lane(attempt: dict[str, Any]) -> str:
    """`api:openai`, `web:acct-1`: the lane's kind with the owner that ran it."""
    kind = str(attempt["lane"]).partition(":")[0]
    return f"{kind}:{attempt['owner']}" if attempt.get("owner") else str(attempt["lane"])


def _clock_time(epoch_s: float | None) -> str:
    return time.strftime("%H:%M:%S", time.localtime(epoch_s)) if epoch_s else "-"


def status(
    task_or_job: Annotated[str, typer.Argument(metavar="ID", help="A task or job id.")],
    as_json: JsonFlag = False,
) -> None:
    """Show a task or a job (an id or a unique prefix of one)."""
    with service_client(as_json) as client:
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
        if data.get("attempts"):
            console.print(_attempts_table(data["attempts"]))


def _act(task_or_job: str, action: str, as_json: bool) -> None:
    with service_client(as_json) as client:
        kind, found = client.resolve(task_or_job)
        data = client.post(f"/v1/{kind}s/{quote(found['id'], safe='')}/{action}")
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
