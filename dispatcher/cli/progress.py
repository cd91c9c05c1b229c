"""Progress display: per-lane job tables, the live watch loop, failure feeds, task bars."""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import quote

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from dispatcher.cli.output import (
    STATE_STYLE,
    STATES,
    console,
    err,
    error_text,
    fmt_seconds,
    result_text,
    styled,
)
from dispatcher.cli.plumbing import EXIT_INTERRUPTED
from dispatcher.cli.service_client import Client
from dispatcher.invocation import cli_command

# A light view's failures printed one by one at most; a job of 10,000
# failing ones is told by its counts and `dispatcher tasks --state failed`.
MAX_FEED_FAILED = 1000
NARROW_BELOW = 100
PAGE = 500


def job_task_pages(client: Client, job_id: str, state: str, most: int) -> list[dict[str, Any]]:
    """A job's tasks in this state, in job order, read page by page (at most `most`)."""
    found: list[dict[str, Any]] = []
    cursor = ""
    while len(found) < most:
        page = client.get(
            f"/v1/jobs/{quote(job_id, safe='')}/tasks?state={state}&limit={PAGE}&cursor={cursor}"
        )
        found += page["items"]
        if page["next"] is None:
            break
        cursor = page["next"]
    return found[:most]


def _progress(done: int, total: int) -> str:
    """A bar and the counts; the counts alone on a narrow terminal (no wrapped bars)."""
    if console.width < NARROW_BELOW:
        return f"{done}/{total}"
    return f"{_bar(done, total)} {done}/{total}"


def _bar(done: int, total: int, width: int = 20) -> str:
    filled = int(width * done / total) if total else width
    return "█" * filled + "░" * (width - filled)


class LaneNames:
    """Which lane a task of a job belongs to, for the per-lane rows."""

    def __init__(self, lanes: list[dict[str, Any]]) -> None:
        self.lanes = {lane["name"]: lane for lane in lanes}
        self._by_model: dict[str, list[str]] = {}
        for lane in lanes:
            for model in lane.get("models", []):
                self._by_model.setdefault(model, []).append(lane["name"])

    def serving(self, model: str) -> list[dict[str, Any]]:
        return [self.lanes[name] for name in self._by_model.get(model, [])]

    def of_model(self, model: str) -> str:
        lanes = self._by_model.get(model, [])
        return lanes[0] if len(lanes) == 1 else f"{model} (any lane)"

    def of(self, task: dict[str, Any]) -> str:
        if task.get("owner"):
            return f"{task['kind']}:{task['owner']}"
        lanes = self._by_model.get(task["model"], [])
        if len(lanes) == 1:
            return lanes[0]
        return f"{task['kind']}:{task['model']} (any account)"


def job_table(
    job: dict[str, Any], lanes: LaneNames | None = None, elapsed_s: float | None = None
) -> Table:
    lanes = lanes or LaneNames([])
    counts = job["counts"]
    total = job["total"]
    done = counts["success"] + counts["failed"] + counts["canceled"]
    title = f"job {escape(job['name'])} ({job['id']}): {styled(job['state'])}"
    if elapsed_s is not None:
        title += f" — {fmt_seconds(elapsed_s)} elapsed"
    table = Table(title=title, title_justify="left", expand=False)
    table.add_column("lane")
    table.add_column("progress")
    for state in STATES:
        table.add_column(state, justify="right", style=STATE_STYLE[state])
    table.add_column("eta", justify="right")
    rows: dict[str, dict[str, Any]] = {}
    overall_eta = 0.0
    for task in job.get("tasks") or []:
        row = rows.setdefault(lanes.of(task), {**dict.fromkeys(STATES, 0), "eta": 0.0})
        row[task["state"]] += 1
        if task["state"] in ("pending", "running") and task.get("eta_s"):
            row["eta"] = max(row["eta"], task["eta_s"])
            overall_eta = max(overall_eta, task["eta_s"])
    if job.get("tasks") is None:
        # The light view: counts per model, one estimate for the whole job.
        for model, counts_of in (job.get("by_model") or {}).items():
            row = rows.setdefault(lanes.of_model(model), {**dict.fromkeys(STATES, 0), "eta": 0.0})
            for state in STATES:
                row[state] += counts_of.get(state, 0)
        overall_eta = job.get("eta_s") or 0.0
    for lane, row in sorted(rows.items()):
        lane_total = sum(row[s] for s in STATES)
        lane_done = row["success"] + row["failed"] + row["canceled"]
        table.add_row(
            escape(lane),
            _progress(lane_done, lane_total),
            *(str(row[s]) for s in STATES),
            fmt_seconds(row["eta"]) if row["eta"] else "-",
        )
    table.add_row(
        "[b]all[/b]",
        _progress(done, total),
        *(str(counts[s]) for s in STATES),
        _job_eta(job, overall_eta),
        end_section=True,
    )
    return table


def _job_eta(job: dict[str, Any], eta_s: float) -> str:
    if job["state"] != "running":
        return "-"
    if job.get("waiting") and not eta_s:
        return "none: " + escape(job["waiting"])
    return fmt_seconds(eta_s) if eta_s else "-"


def task_label(task: dict[str, Any]) -> str:
    """The task's id, with its ref when it has one."""
    return f"{task['id']} ({task['ref']})" if task.get("ref") else str(task["id"])


def failures_table(job: dict[str, Any]) -> Table:
    table = Table(title="failed tasks", title_justify="left")
    for column in ("task", "ref", "model", "attempt", "error"):
        table.add_column(column, overflow="fold")
    for task in job.get("tasks") or []:
        if task["state"] == "failed":
            table.add_row(
                task["id"],
                escape(task.get("ref") or "-"),
                escape(task["model"]),
                f"{task['attempt']}/{task['max_attempts']}",
                escape(error_text(task)),
            )
    return table


class FailureFeed:
    """Prints failures and automatic retries once each, as they happen."""

    def __init__(self, out: Console, client: Client | None = None) -> None:
        self.out = out
        self.client = client
        self._failed: set[tuple[str, int]] = set()
        self._retrying: set[tuple[str, int]] = set()
        self._failed_count = 0

    def update_job(self, job: dict[str, Any]) -> None:
        """From the job's tasks, or for a light view the failed ones read in
        pages when their count grows (up to MAX_FEED_FAILED: past that the
        counts tell it; retries show only with the tasks)."""
        if job.get("tasks") is not None:
            self.update(job["tasks"])
            return
        failed = job["counts"]["failed"]
        if self.client is None or failed <= self._failed_count:
            return
        self._failed_count = failed
        if len(self._failed) < MAX_FEED_FAILED:
            self.update(job_task_pages(self.client, job["id"], "failed", MAX_FEED_FAILED))

    def update(self, tasks: list[dict[str, Any]]) -> None:
        for task in tasks:
            key = (task["id"], task["attempt"])
            if task["state"] == "failed" and key not in self._failed:
                self._failed.add(key)
                self.out.print(
                    f"[red]failed[/red] {escape(task_label(task))} {escape(task['model'])} "
                    f"attempt {task['attempt']}/{task['max_attempts']}: "
                    f"{escape(error_text(task))}",
                    soft_wrap=True,
                )
            elif (
                task["state"] in ("pending", "running")
                and task["attempt"] > 1
                and task.get("error")
                and key not in self._retrying
            ):
                self._retrying.add(key)
                self.out.print(
                    f"[yellow]retrying[/yellow] {escape(task_label(task))} "
                    f"{escape(task['model'])} "
                    f"(attempt {task['attempt']}/{task['max_attempts']}) after "
                    f"{escape(error_text(task))}",
                    soft_wrap=True,
                )


def pending_by_model(job: dict[str, Any]) -> dict[str, int]:
    """Waiting tasks per model, from the light view's counts or else the tasks."""
    if job.get("by_model") is not None:
        return {m: c["pending"] for m, c in job["by_model"].items() if c.get("pending")}
    pending: dict[str, int] = {}
    for task in job.get("tasks") or []:
        if task["state"] == "pending":
            pending[task["model"]] = pending.get(task["model"], 0) + 1
    return pending


class ClosedLanes:
    """Says once when pending tasks wait for lanes that are switched off."""

    CHECK_EVERY_S = 2.0

    def __init__(self, client: Client, lanes: LaneNames) -> None:
        self.client = client
        self.lanes = lanes
        self._checked = time.monotonic()
        self._told: set[tuple[str, str]] = set()

    def update(self, job: dict[str, Any], out: Console) -> None:
        if time.monotonic() - self._checked < self.CHECK_EVERY_S:
            return
        self._checked = time.monotonic()
        pending = pending_by_model(job)
        if not pending:
            return
        self.lanes = LaneNames(self.client.get("/v1/lanes"))
        waiting: dict[str, int] = {}
        closed: dict[str, dict[str, Any]] = {}
        for model, count in pending.items():
            serving = self.lanes.serving(model)
            if serving and not any(
                lane["enabled"] and not lane["needs_attention"] for lane in serving
            ):
                for lane in serving:
                    waiting[lane["name"]] = waiting.get(lane["name"], 0) + count
                    closed[lane["name"]] = lane
        for name, lane in closed.items():
            why = "needs attention" if lane["needs_attention"] else "is disabled"
            key = (name, f"{why} {lane['reason']}")
            if key in self._told:
                continue
            self._told.add(key)
            out.print(
                f"[yellow]waiting[/yellow]: lane {escape(name)} {why}"
                f"{': ' + escape(lane['reason']) if lane['reason'] else ''} — "
                f"{waiting[name]} task(s) wait for it; once fixed: "
                f"{cli_command()} accounts enable {escape(lane['owner'])}",
                soft_wrap=True,
            )
        self._told = {k for k in self._told if k[0] in closed}


def watch_job(
    client: Client,
    job_id: str,
    *,
    as_json: bool = False,
    interval_s: float = 0.5,
    out: Console | None = None,
) -> dict[str, Any]:
    """Poll a job until it ends, with a live per-lane table unless `as_json`."""
    from rich.live import Live

    out = out or console
    started = time.monotonic()
    job: dict[str, Any] = client.get(f"/v1/jobs/{job_id}?tasks=none")
    if as_json:
        while job["state"] == "running":
            time.sleep(interval_s)
            job = client.get(f"/v1/jobs/{job_id}?tasks=none")
        return dict(client.get(f"/v1/jobs/{job_id}"))
    poll = JobPoll(client, job)
    job = poll.next()
    lanes = LaneNames(client.get("/v1/lanes"))
    feed = FailureFeed(out, client)
    closed = ClosedLanes(client, lanes)
    if not out.is_terminal:
        return _watch_plain(poll, job, lanes, feed, closed, interval_s, started)
    with Live(
        job_table(job, lanes, 0.0), console=out, refresh_per_second=4, transient=False
    ) as live:
        while True:
            feed.out = live.console
            feed.update_job(job)
            closed.update(job, live.console)
            live.update(job_table(job, lanes, time.monotonic() - started))
            if job["state"] != "running":
                break
            time.sleep(interval_s)
            job = poll.next()
    return job


class JobPoll:
    """The job's answer, with every task only while the job is small: a big
    job's would be megabytes per poll (the light view and pages instead)."""

    def __init__(self, client: Client, light: dict[str, Any]) -> None:
        self.client = client
        self.path = f"/v1/jobs/{quote(light['id'], safe='')}"
        self.small = light["total"] <= PAGE

    def next(self) -> dict[str, Any]:
        return dict(self.client.get(self.path if self.small else f"{self.path}?tasks=none"))


def _watch_plain(
    poll: JobPoll,
    job: dict[str, Any],
    lanes: LaneNames,
    feed: FailureFeed,
    closed: ClosedLanes,
    interval_s: float,
    started: float,
) -> dict[str, Any]:
    """For logs and pipes: a line whenever the counts move, then the final table."""
    last: tuple[int, ...] = ()
    while True:
        feed.update_job(job)
        closed.update(job, feed.out)
        counts = job["counts"]
        now = tuple(counts[s] for s in STATES)
        if now != last:
            last = now
            done = counts["success"] + counts["failed"] + counts["canceled"]
            feed.out.print(
                f"progress {done}/{job['total']}: "
                + ", ".join(f"{counts[s]} {s}" for s in STATES if counts[s])
                + f" ({fmt_seconds(time.monotonic() - started)} elapsed)"
            )
        if job["state"] != "running":
            break
        time.sleep(interval_s)
        job = poll.next()
    feed.out.print(job_table(job, lanes, time.monotonic() - started))
    return job


def summary(job: dict[str, Any], out: Console) -> None:
    counts = job["counts"]
    parts = [f"{counts[s]} {s}" for s in ("success", "failed", "canceled") if counts[s]]
    cached = f", {job['from_cache']} from cache" if job.get("from_cache") else ""
    out.print(
        f"job {escape(job['name'])} {job['id']}: {styled(job['state'])} — "
        f"{', '.join(parts) or 'nothing ran'} of {job['total']}{cached}"
    )
    if counts["failed"] and job.get("tasks") is not None:
        out.print(failures_table(job))
    elif counts["failed"]:
        out.print(
            f"list the failed ones with: {cli_command()} tasks --job {job['id']} --state failed"
        )
    if counts["failed"]:
        out.print(f"retry the failed ones with: {cli_command()} retry {job['id']}")


def wait_task(client: Client, task: dict[str, Any], quiet: bool) -> dict[str, Any]:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.fields[note]}"),
        TimeElapsedColumn(),
    )
    try:
        with Progress(*columns, console=err, transient=True, disable=quiet) as progress:
            bar = progress.add_task(f"{task['model']} {task['id'][:8]}", total=100, note="")
            while task["state"] in ("pending", "running"):
                if task["state"] == "pending" and task.get("waiting"):
                    note = f"pending, {task['ahead']} ahead, {task['waiting']}"
                elif task["state"] == "pending":
                    note = f"pending, {task['ahead']} ahead, eta {fmt_seconds(task.get('eta_s'))}"
                else:
                    note = f"{task.get('stage') or 'running'}, eta {fmt_seconds(task.get('eta_s'))}"
                    if task.get("queue_position") is not None:
                        note += f", queue {task['queue_position']}"
                progress.update(bar, completed=task.get("progress") or 0, note=note)
                time.sleep(0.3)
                task = client.get(f"/v1/tasks/{task['id']}")
            progress.update(bar, completed=100, note=task["state"])
    except KeyboardInterrupt:
        err.print(
            f"stopped watching; task {task['id']} keeps running "
            f"({cli_command()} status {task['id']})"
        )
        raise typer.Exit(EXIT_INTERRUPTED) from None
    return task


def describe_end(task: dict[str, Any]) -> None:
    line = f"{task['id']}: {styled(task['state'])}"
    if task.get("started_at") and task.get("finished_at"):
        line += f" in {task['finished_at'] - task['started_at']:.1f}s"
    if task["state"] == "success" and result_text(task):
        line += f" — {escape(result_text(task))}"
    elif task.get("error"):
        line += f" — {escape(error_text(task))}"
    err.print(line)
