"""The command line: serve, submit, batch with live progress, status, switches.

Every command but `serve` and `demo-run` talks to the running service through
the port and token files in the state dir (``--state-dir``, else
``DISPATCHER_STATE_DIR``, else the settings' default). The token is read from
that file and sent as a header; it is never printed.

Exit codes: 0 fine; 1 a task or job failed or was canceled, or the service
refused the request; 2 bad input (arguments, batch file, settings); 3 the
service is not running or refused the token; 130 interrupted.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn
from urllib.parse import quote

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from dispatcher.batchfile import BatchLine, locate, read_batch_lines
from dispatcher.client import ApiError, Client, ServiceUnavailable, StaleToken
from dispatcher.errors import ConfigError, DispatcherError, InputError

if TYPE_CHECKING:
    from dispatcher.settings import Settings

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 3
EXIT_INTERRUPTED = 130

app = typer.Typer(
    add_completion=False,
    no_args_is_help=False,
    rich_markup_mode=None,
    help="Run AI-generation tasks against web and API models, each in its own lane. "
    "With no command: serve until SIGTERM.",
    epilog="Exit codes: 0 ok, 1 a task/job failed or the request was refused, 2 bad input, "
    "3 the service is not running or the token is stale, 130 interrupted.",
)
accounts_app = typer.Typer(help="List, disable and enable web accounts and API providers.")
app.add_typer(accounts_app, name="accounts")
console = Console(highlight=False)
err = Console(stderr=True, highlight=False, soft_wrap=True)

JsonFlag = Annotated[bool, typer.Option("--json", help="Machine-readable output on stdout.")]
BATCH_SAMPLE = Path(__file__).resolve().parent.parent / "demo" / "sample-batch.jsonl"
STATES = ("pending", "running", "success", "failed", "canceled")
_STATE_STYLE = {"pending": "dim", "running": "cyan", "success": "green", "failed": "red",
                "canceled": "yellow", "partial": "magenta"}
_options: dict[str, Any] = {}


# -- plumbing ---------------------------------------------------------------------------
def _settings(**overrides: Any) -> Settings:
    from dispatcher.settings import Settings

    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})
    except Exception as exc:  # pydantic's ValidationError: say it plainly
        err.print(f"[red]invalid settings:[/red] {escape(str(exc))}")
        raise typer.Exit(EXIT_USAGE) from exc


def _state_dir() -> Path:
    """Where the running service keeps its port and token files."""
    if _options.get("state_dir"):
        return Path(_options["state_dir"])
    # The environment outranks .env and dispatcher.toml: no need to load settings.
    from_env = os.environ.get("DISPATCHER_STATE_DIR")
    if from_env:
        return Path(from_env)
    return _settings().state_dir


def _exit(message: str, code: int) -> NoReturn:
    err.print(f"[red]error:[/red] {escape(message)}")
    raise typer.Exit(code)


@contextmanager
def _handled() -> Iterator[None]:
    """Turn the errors a command may meet into one clear line and an exit code."""
    try:
        yield
    except (ServiceUnavailable, StaleToken) as exc:
        _exit(str(exc), EXIT_UNAVAILABLE)
    except (InputError, ConfigError) as exc:
        _exit(str(exc), EXIT_USAGE)
    except ApiError as exc:
        _exit(f"{exc} (HTTP {exc.status})", EXIT_FAILED)
    except DispatcherError as exc:
        _exit(str(exc), EXIT_FAILED)


@contextmanager
def _client() -> Iterator[Client]:
    with _handled():
        client = Client(_state_dir())
        try:
            yield client
        finally:
            client.close()


def _print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2) + "\n")
    sys.stdout.flush()


def _styled(state: str) -> str:
    style = _STATE_STYLE.get(state, "")
    return f"[{style}]{state}[/{style}]" if style else state


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    seconds = max(0, round(value))
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    return f"{minutes // 60}h{minutes % 60:02d}m"


def _error_text(task: dict[str, Any]) -> str:
    error = task.get("error") or {}
    return f"{error.get('kind')}: {error.get('message')}" if error else ""


# -- serving ----------------------------------------------------------------------------
LogFormat = Annotated[
    str | None,
    typer.Option("--log-format", help="text or json (default: DISPATCHER_LOG_FORMAT, else text)."),
]
LogLevel = Annotated[str | None, typer.Option("--log-level", help="DEBUG, INFO, WARNING...")]
DemoFlag = Annotated[bool, typer.Option("--demo", help="Also run the bundled demo backends.")]
PortOption = Annotated[int | None, typer.Option("--port", help="Port for the local API.")]


@app.callback(invoke_without_command=True)
def main_callback(
    ctx: typer.Context,
    demo: DemoFlag = False,
    port: PortOption = None,
    log_format: LogFormat = None,
    log_level: LogLevel = None,
    state_dir: Annotated[
        Path | None,
        typer.Option("--state-dir",
                     help="The service's state dir (default: DISPATCHER_STATE_DIR)."),
    ] = None,
) -> None:
    _options["state_dir"] = state_dir
    if ctx.invoked_subcommand is None:
        serve(demo=demo, port=port, log_format=log_format, log_level=log_level)


@app.command()
def serve(
    demo: DemoFlag = False,
    port: PortOption = None,
    log_format: LogFormat = None,
    log_level: LogLevel = None,
) -> None:
    """Serve until SIGTERM (also the default).

    What `python -m dispatcher` does with no command; SIGTERM stops running
    tasks at their checkpoints and leaves them recoverable.
    """
    from dispatcher.logs import FORMATS, setup_logging

    if log_format is not None and log_format not in FORMATS:
        _exit(f"--log-format must be one of {', '.join(FORMATS)}", EXIT_USAGE)
    settings = _settings(
        demo=demo or None, port=port, log_format=log_format, log_level=log_level,
        state_dir=_options.get("state_dir"),
    )
    try:
        setup_logging(settings.log_level, settings.log_format)
    except ValueError as exc:
        _exit(f"invalid log level {settings.log_level!r}: {exc}", EXIT_USAGE)
    import asyncio

    from dispatcher.service import Service

    try:
        asyncio.run(Service(settings).serve_forever())
    except ConfigError as exc:
        _exit(str(exc), EXIT_USAGE)
    except DispatcherError as exc:
        _exit(str(exc), EXIT_FAILED)
    except KeyboardInterrupt:
        pass


# -- progress display ---------------------------------------------------------------
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

    def of(self, task: dict[str, Any]) -> str:
        if task.get("account"):
            return f"{task['kind']}:{task['account']}"
        lanes = self._by_model.get(task["model"], [])
        if len(lanes) == 1:
            return lanes[0]
        return f"{task['kind']}:{task['model']} (any account)"


def job_table(job: dict[str, Any], lanes: LaneNames | None = None,
              elapsed_s: float | None = None) -> Table:
    lanes = lanes or LaneNames([])
    counts = job["counts"]
    total = job["total"]
    done = counts["success"] + counts["failed"] + counts["canceled"]
    title = f"job {escape(job['name'])} ({job['id']}): {_styled(job['state'])}"
    if elapsed_s is not None:
        title += f" — {_seconds(elapsed_s)} elapsed"
    table = Table(title=title, title_justify="left", expand=False)
    table.add_column("lane")
    table.add_column("progress")
    for state in STATES:
        table.add_column(state, justify="right", style=_STATE_STYLE[state])
    table.add_column("eta", justify="right")
    rows: dict[str, dict[str, Any]] = {}
    overall_eta = 0.0
    for task in job.get("tasks", []):
        row = rows.setdefault(lanes.of(task), {**dict.fromkeys(STATES, 0), "eta": 0.0})
        row[task["state"]] += 1
        if task["state"] in ("pending", "running") and task.get("eta_s"):
            row["eta"] = max(row["eta"], task["eta_s"])
            overall_eta = max(overall_eta, task["eta_s"])
    for lane, row in sorted(rows.items()):
        lane_total = sum(row[s] for s in STATES)
        lane_done = row["success"] + row["failed"] + row["canceled"]
        table.add_row(escape(lane), f"{_bar(lane_done, lane_total)} {lane_done}/{lane_total}",
                      *(str(row[s]) for s in STATES),
                      _seconds(row["eta"]) if row["eta"] else "-")
    table.add_row("[b]all[/b]", f"{_bar(done, total)} {done}/{total}",
                  *(str(counts[s]) for s in STATES),
                  _seconds(overall_eta) if overall_eta and job["state"] == "running" else "-",
                  end_section=True)
    return table


def failures_table(job: dict[str, Any]) -> Table:
    table = Table(title="failed tasks", title_justify="left")
    for column in ("task", "model", "attempt", "error"):
        table.add_column(column, overflow="fold")
    for task in job.get("tasks", []):
        if task["state"] == "failed":
            table.add_row(task["id"], escape(task["model"]),
                          f"{task['attempt']}/{task['max_attempts']}", escape(_error_text(task)))
    return table


class FailureFeed:
    """Prints failures and automatic retries once each, as they happen."""

    def __init__(self, out: Console) -> None:
        self.out = out
        self._failed: set[tuple[str, int]] = set()
        self._retrying: set[tuple[str, int]] = set()

    def update(self, tasks: list[dict[str, Any]]) -> None:
        for task in tasks:
            key = (task["id"], task["attempt"])
            if task["state"] == "failed" and key not in self._failed:
                self._failed.add(key)
                self.out.print(f"[red]failed[/red] {task['id']} {escape(task['model'])} "
                               f"attempt {task['attempt']}/{task['max_attempts']}: "
                               f"{escape(_error_text(task))}", soft_wrap=True)
            elif (task["state"] in ("pending", "running") and task["attempt"] > 1
                  and task.get("error") and key not in self._retrying):
                self._retrying.add(key)
                self.out.print(f"[yellow]retrying[/yellow] {task['id']} {escape(task['model'])} "
                               f"(attempt {task['attempt']}/{task['max_attempts']}) after "
                               f"{escape(_error_text(task))}", soft_wrap=True)


class ClosedLanes:
    """Says once when pending tasks wait for lanes that are switched off."""

    CHECK_EVERY_S = 2.0

    def __init__(self, client: Client, lanes: LaneNames) -> None:
        self.client = client
        self.lanes = lanes
        self._checked = time.monotonic()
        self._told: set[tuple[str, str]] = set()

    def update(self, tasks: list[dict[str, Any]], out: Console) -> None:
        if time.monotonic() - self._checked < self.CHECK_EVERY_S:
            return
        self._checked = time.monotonic()
        pending = [t for t in tasks if t["state"] == "pending"]
        if not pending:
            return
        self.lanes = LaneNames(self.client.get("/v1/lanes"))
        waiting: dict[str, int] = {}
        closed: dict[str, dict[str, Any]] = {}
        for task in pending:
            serving = self.lanes.serving(task["model"])
            if serving and not any(lane["enabled"] and not lane["needs_attention"]
                                   for lane in serving):
                for lane in serving:
                    waiting[lane["name"]] = waiting.get(lane["name"], 0) + 1
                    closed[lane["name"]] = lane
        for name, lane in closed.items():
            why = "needs attention" if lane["needs_attention"] else "is disabled"
            key = (name, f"{why} {lane['reason']}")
            if key in self._told:
                continue
            self._told.add(key)
            out.print(f"[yellow]waiting[/yellow]: lane {escape(name)} {why}"
                      f"{': ' + escape(lane['reason']) if lane['reason'] else ''} — "
                      f"{waiting[name]} task(s) wait for it; once fixed: "
                      f"python -m dispatcher accounts enable {escape(lane['account'])}",
                      soft_wrap=True)
        self._told = {k for k in self._told if k[0] in closed}


def watch_job(client: Client, job_id: str, *, as_json: bool = False,
              interval_s: float = 0.5, out: Console | None = None) -> dict[str, Any]:
    """Poll a job until it ends, with a live per-lane table unless `as_json`."""
    from rich.live import Live

    out = out or console
    started = time.monotonic()
    job: dict[str, Any] = client.get(f"/v1/jobs/{job_id}")
    if as_json:
        while job["state"] == "running":
            time.sleep(interval_s)
            job = client.get(f"/v1/jobs/{job_id}")
        return job
    lanes = LaneNames(client.get("/v1/lanes"))
    feed = FailureFeed(out)
    closed = ClosedLanes(client, lanes)
    if not out.is_terminal:
        return _watch_plain(client, job, lanes, feed, closed, interval_s, started)
    with Live(job_table(job, lanes, 0.0), console=out, refresh_per_second=4,
              transient=False) as live:
        while True:
            feed.out = live.console
            feed.update(job["tasks"])
            closed.update(job["tasks"], live.console)
            live.update(job_table(job, lanes, time.monotonic() - started))
            if job["state"] != "running":
                break
            time.sleep(interval_s)
            job = client.get(f"/v1/jobs/{job_id}")
    return job


def _watch_plain(client: Client, job: dict[str, Any], lanes: LaneNames, feed: FailureFeed,
                 closed: ClosedLanes, interval_s: float, started: float) -> dict[str, Any]:
    """For logs and pipes: a line whenever the counts move, then the final table."""
    last: tuple[int, ...] = ()
    while True:
        feed.update(job["tasks"])
        closed.update(job["tasks"], feed.out)
        counts = job["counts"]
        now = tuple(counts[s] for s in STATES)
        if now != last:
            last = now
            done = counts["success"] + counts["failed"] + counts["canceled"]
            feed.out.print(f"progress {done}/{job['total']}: "
                           + ", ".join(f"{counts[s]} {s}" for s in STATES if counts[s])
                           + f" ({_seconds(time.monotonic() - started)} elapsed)")
        if job["state"] != "running":
            break
        time.sleep(interval_s)
        job = client.get(f"/v1/jobs/{job['id']}")
    feed.out.print(job_table(job, lanes, time.monotonic() - started))
    return job


def _summary(job: dict[str, Any], out: Console) -> None:
    counts = job["counts"]
    parts = [f"{counts[s]} {s}" for s in ("success", "failed", "canceled") if counts[s]]
    out.print(f"job {escape(job['name'])} {job['id']}: {_styled(job['state'])} — "
              f"{', '.join(parts) or 'nothing ran'} of {job['total']}")
    if counts["failed"]:
        out.print(failures_table(job))
        out.print(f"retry the failed ones with: python -m dispatcher retry {job['id']}")


# -- commands -------------------------------------------------------------------------
def _params(prompt: str, items: list[str]) -> dict[str, Any]:
    params: dict[str, Any] = {"prompt": prompt}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            _exit(f"--param takes KEY=VALUE, got {item!r}", EXIT_USAGE)
        try:
            params[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            params[key.strip()] = value
    return params


@app.command()
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
    with _client() as client:
        task = client.post("/v1/tasks", body)
        if task["deduped"]:
            err.print(f"deduped: an identical task was submitted moments ago ({task['state']})")
        elif task["from_cache"]:
            err.print("answered from the result cache")
        if not as_json:
            sys.stdout.write(f"{task['id']}\n")
            sys.stdout.flush()
        if wait:
            task = _wait_task(client, task, quiet=as_json)
    if as_json:
        _print_json(task)
    elif wait:
        _describe_end(task)
    if wait and task["state"] != "success":
        raise typer.Exit(EXIT_FAILED)


def _wait_task(client: Client, task: dict[str, Any], quiet: bool) -> dict[str, Any]:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[note]}"),
               TimeElapsedColumn())
    try:
        with Progress(*columns, console=err, transient=True, disable=quiet) as progress:
            bar = progress.add_task(f"{task['model']} {task['id'][:8]}", total=100, note="")
            while task["state"] in ("pending", "running"):
                if task["state"] == "pending":
                    note = f"pending, {task['ahead']} ahead, eta {_seconds(task.get('eta_s'))}"
                else:
                    note = f"{task.get('stage') or 'running'}, eta {_seconds(task.get('eta_s'))}"
                    if task.get("queue_position") is not None:
                        note += f", queue {task['queue_position']}"
                progress.update(bar, completed=task.get("progress") or 0, note=note)
                time.sleep(0.3)
                task = client.get(f"/v1/tasks/{task['id']}")
            progress.update(bar, completed=100, note=task["state"])
    except KeyboardInterrupt:
        err.print(f"stopped watching; task {task['id']} keeps running "
                  f"(python -m dispatcher status {task['id']})")
        raise typer.Exit(EXIT_INTERRUPTED) from None
    return task


def _result_text(task: dict[str, Any]) -> str:
    result = task.get("result") or {}
    if result.get("files"):
        return ", ".join(f"{f.get('name') or f.get('path')} ({f.get('size')} bytes)"
                         for f in result["files"])
    text = str(result.get("text") or "")
    return text if len(text) <= 300 else text[:300] + "…"


def _describe_end(task: dict[str, Any]) -> None:
    line = f"{task['id']}: {_styled(task['state'])}"
    if task.get("started_at") and task.get("finished_at"):
        line += f" in {task['finished_at'] - task['started_at']:.1f}s"
    if task["state"] == "success" and _result_text(task):
        line += f" — {escape(_result_text(task))}"
    elif task.get("error"):
        line += f" — {escape(_error_text(task))}"
    err.print(line)


@app.command()
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
    with _handled():
        lines = read_batch_lines(file)
    with _client() as client:
        job = _create_job(client, name or file.stem, file, lines)
        if detach:
            if as_json:
                _print_json(job)
            else:
                sys.stdout.write(f"{job['id']}\n")
            return
        if not as_json:
            console.print(f"job {job['id']}: {job['total']} tasks from {escape(str(file))}")
        try:
            job = watch_job(client, job["id"], as_json=as_json)
        except KeyboardInterrupt:
            err.print(f"stopped watching; job {job['id']} keeps running "
                      f"(python -m dispatcher status {job['id']}, or cancel {job['id']})")
            raise typer.Exit(EXIT_INTERRUPTED) from None
    if as_json:
        _print_json(job)
    else:
        _summary(job, console)
    if job["counts"]["failed"] or job["counts"]["canceled"]:
        raise typer.Exit(EXIT_FAILED)


def _create_job(client: Client, name: str, file: Path, lines: list[BatchLine]) -> dict[str, Any]:
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
        ("state", task["state"] + (" (cancel requested)" if task.get("cancel_requested")
                                   and task["state"] == "running" else "")),
        ("stage", task.get("stage") or "-"),
        ("attempt", f"{task['attempt']}/{task['max_attempts']}"),
    ]
    if task["state"] == "pending":
        rows.append(("ahead", str(task.get("ahead", 0))))
    if task["state"] in ("pending", "running"):
        rows.append(("eta", _seconds(task.get("eta_s"))))
    if task.get("progress") is not None:
        rows.append(("progress", f"{task['progress']:.0f}%"))
    if task.get("error"):
        rows.append(("error", _error_text(task)))
    if task["state"] == "success":
        cached = " (from cache)" if task.get("from_cache") else ""
        rows.append(("result", _result_text(task) + cached))
    if task.get("stage_durations"):
        stages = task["stage_durations"].items()
        rows.append(("stages", ", ".join(f"{k} {v:.1f}s" for k, v in stages)))
    for key, label in (("created_at", "created"), ("started_at", "started"),
                       ("finished_at", "finished")):
        if task.get(key):
            rows.append((label, time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(task[key]))))
    for field, value in rows:
        table.add_row(field, _styled(value) if field == "state" else escape(value))
    return table


@app.command()
def status(
    task_or_job: Annotated[str, typer.Argument(metavar="ID", help="A task or job id.")],
    as_json: JsonFlag = False,
) -> None:
    """Show a task or a job."""
    with _client() as client:
        kind, data = client.resolve(task_or_job)
        lanes = LaneNames(client.get("/v1/lanes")) if kind == "job" and not as_json else None
    if as_json:
        _print_json(data)
    elif kind == "job":
        console.print(job_table(data, lanes))
        if data["counts"]["failed"]:
            console.print(failures_table(data))
    else:
        console.print(_task_table(data))


def _act(task_or_job: str, action: str, as_json: bool) -> None:
    with _client() as client:
        kind, _ = client.resolve(task_or_job)
        data = client.post(f"/v1/{kind}s/{quote(task_or_job, safe='')}/{action}")
    if as_json:
        _print_json(data)
    elif kind == "task":
        extra = f", attempt {data['attempt']}/{data['max_attempts']}" if action == "retry" else ""
        note = " (cancel requested; it stops at its next checkpoint)" if (
            action == "cancel" and data["state"] == "running") else ""
        console.print(f"task {data['id']}: {_styled(data['state'])}{extra}{note}")
    else:
        counts = data["counts"]
        console.print(f"job {escape(data['name'])} {data['id']}: {_styled(data['state'])} — "
                      + ", ".join(f"{counts[s]} {s}" for s in STATES if counts[s]))


@app.command()
def cancel(
    task_or_job: Annotated[str, typer.Argument(metavar="ID", help="A task or job id.")],
    as_json: JsonFlag = False,
) -> None:
    """Cancel a task, or a job's pending and running tasks."""
    _act(task_or_job, "cancel", as_json)


@app.command()
def retry(
    task_or_job: Annotated[str, typer.Argument(metavar="ID", help="A task or job id.")],
    as_json: JsonFlag = False,
) -> None:
    """Retry a failed task, or a job's failed tasks.

    Tasks that succeeded are never run again.
    """
    _act(task_or_job, "retry", as_json)


@accounts_app.callback(invoke_without_command=True)
def accounts_list(ctx: typer.Context, as_json: JsonFlag = False) -> None:
    """List accounts and providers with their switches."""
    if ctx.invoked_subcommand is not None:
        return
    with _client() as client:
        data = client.get("/v1/accounts")
    if as_json:
        _print_json(data)
        return
    table = Table("name", "kind", "enabled", "needs attention", "reason", "since")
    for account in data:
        table.add_row(
            escape(account["name"]), account["kind"],
            "yes" if account["enabled"] else "[red]no[/red]",
            "[red]yes[/red]" if account["needs_attention"] else "no",
            escape(account["reason"] or ""),
            time.strftime("%Y-%m-%d %H:%M", time.localtime(account["updated_at"]))
            if account.get("updated_at") else "",
        )
    console.print(table)


@accounts_app.command("disable")
def accounts_disable(
    name: Annotated[str, typer.Argument(help="A web account or API provider.")],
    reason: Annotated[str, typer.Option("--reason", help="Why (shown to the team).")],
    as_json: JsonFlag = False,
) -> None:
    """Disable a lane (it finishes its running task)."""
    with _client() as client:
        data = client.post(f"/v1/accounts/{quote(name, safe='')}/disable", {"reason": reason})
    if as_json:
        _print_json(data)
    else:
        console.print(f"{escape(name)}: disabled ({escape(data['reason'] or '')})")


@accounts_app.command("enable")
def accounts_enable(
    name: Annotated[str, typer.Argument(help="A web account or API provider.")],
    as_json: JsonFlag = False,
) -> None:
    """Enable a lane (also clears needs-attention)."""
    with _client() as client:
        data = client.post(f"/v1/accounts/{quote(name, safe='')}/enable")
    if as_json:
        _print_json(data)
    else:
        console.print(f"{escape(name)}: enabled")


@app.command()
def lanes(as_json: JsonFlag = False) -> None:
    """Lanes with concurrency, queue depth and running tasks."""
    with _client() as client:
        data = client.get("/v1/lanes")
    if as_json:
        _print_json(data)
        return
    table = Table("lane", "models", "concurrency", "enabled", "queued", "running")
    for lane in data:
        if lane["enabled"] and not lane["needs_attention"]:
            state = "yes"
        else:
            why = "needs attention" if lane["needs_attention"] else "no"
            state = f"[red]{why}[/red] {escape(lane['reason'] or '')}"
        table.add_row(escape(lane["name"]), escape(", ".join(lane["models"])),
                      str(lane["concurrency"]), state, str(lane["queued"]),
                      ", ".join(lane["running"]) or "-")
    console.print(table)


@app.command()
def dashboard() -> None:
    """Print a one-time dashboard URL.

    The code in it is valid for 2 minutes and works once; the page trades it
    for a session cookie. The token itself never leaves the state dir.
    """
    with _client() as client:
        code = client.post("/v1/dashboard-code")["code"]
        url = f"{client.base_url}/v1/session?code={code}"
        port = client.port
    sys.stdout.write(url + "\n")
    sys.stdout.flush()
    err.print(f"open it within 2 minutes; it works once. From another machine, tunnel first: "
              f"ssh -N -L {port}:127.0.0.1:{port} <this host>")


@app.command("demo-run")
def demo_run(
    exit_when_done: Annotated[bool, typer.Option(help="Stop once the sample batch ends.")] = False,
    batch_file: Annotated[Path, typer.Option(help="The sample batch.")] = BATCH_SAMPLE,
) -> None:
    """Demo: serve, run the sample batch, keep serving.

    Starts the service with the bundled demo backends, prints a dashboard URL,
    runs the sample batch to completion with live progress, then keeps serving.
    """
    import asyncio

    from dispatcher.logs import setup_logging
    from dispatcher.service import Service

    settings = _settings(demo=True, state_dir=_options.get("state_dir"))
    setup_logging("WARNING", settings.log_format)
    with _handled():
        lines = read_batch_lines(batch_file)

    def drive(url: str) -> str:
        # A thread of its own: the blocking client must not stall the service's loop.
        with Client(settings.state_dir) as client:
            code = client.post("/v1/dashboard-code")["code"]
            console.print(f"dispatcher running on {url} (state dir {settings.state_dir})")
            console.print(f"dashboard (open within 2 minutes): {url}/v1/session?code={code}")
            known = {m for lane in client.get("/v1/lanes") for m in lane["models"]}
            runnable = [line for line in lines if line.task["model"] in known]
            skipped = sorted({line.task["model"] for line in lines} - known)
            if skipped:
                err.print(f"[yellow]skipping[/yellow] {len(lines) - len(runnable)} task(s) for "
                          f"models not loaded here: {', '.join(skipped)}")
            if not runnable:
                return "nothing to run"
            job = _create_job(client, "demo", batch_file, runnable)
            job = watch_job(client, job["id"])
            _summary(job, console)
            return str(job["state"])

    async def run() -> int:
        service = Service(settings)
        await service.start()
        try:
            state = await asyncio.to_thread(drive, service.url)
            if exit_when_done:
                return EXIT_OK if state == "success" else EXIT_FAILED
            console.print("still serving; try `.venv/bin/python -m dispatcher batch "
                          "demo/sample-batch.csv` or `... dashboard` in another shell "
                          f"(DISPATCHER_STATE_DIR={settings.state_dir}). Ctrl-C stops.")
            await asyncio.Event().wait()
            return EXIT_OK
        finally:
            await service.stop()

    code = EXIT_OK
    with _handled():
        try:
            code = asyncio.run(run())
        except KeyboardInterrupt:
            code = EXIT_OK
    raise typer.Exit(code)


def main() -> None:
    app()
