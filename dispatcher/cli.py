"""The command line: serve, submit, batch with live progress, status, switches."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.live import Live
from rich.table import Table

from dispatcher.batchfile import read_batch
from dispatcher.client import Client
from dispatcher.errors import DispatcherError
from dispatcher.logs import setup_logging
from dispatcher.settings import Settings

app = typer.Typer(
    add_completion=False,
    no_args_is_help=False,
    help="Run AI-generation tasks against web and API models, each in its own lane.",
)
accounts_app = typer.Typer(help="List, disable and enable web accounts and API providers.")
app.add_typer(accounts_app, name="accounts")
console = Console()
err = Console(stderr=True)

JsonFlag = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]
BATCH_SAMPLE = Path(__file__).resolve().parent.parent / "demo" / "sample-batch.jsonl"


def _settings(**overrides: Any) -> Settings:
    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})
    except Exception as exc:  # pydantic's ValidationError: say it plainly
        err.print(f"[red]invalid settings:[/red] {exc}")
        raise typer.Exit(2) from exc


def _fail(exc: DispatcherError) -> typer.Exit:
    err.print(f"[red]error:[/red] {exc}")
    return typer.Exit(1)


def _client() -> Client:
    try:
        return Client(_settings().state_dir)
    except DispatcherError as exc:
        raise _fail(exc) from exc


def _call(method: str, path: str, body: Any = None) -> Any:
    with _client() as client:
        try:
            return client.request(method, path, json=body)
        except DispatcherError as exc:
            raise _fail(exc) from exc


def _print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2) + "\n")


@app.callback(invoke_without_command=True)
def main_callback(
    ctx: typer.Context,
    demo: Annotated[bool, typer.Option("--demo", help="Also run the bundled demo backends.")] = False,
    port: Annotated[int | None, typer.Option(help="Port for the local API.")] = None,
) -> None:
    """With no command: serve until SIGTERM."""
    if ctx.invoked_subcommand is None:
        serve(demo=demo, port=port)


def serve(demo: bool = False, port: int | None = None) -> None:
    from dispatcher.service import Service

    settings = _settings(demo=demo or None, port=port)
    setup_logging(settings.log_level, settings.log_format)
    try:
        asyncio.run(Service(settings).serve_forever())
    except DispatcherError as exc:
        raise _fail(exc) from exc
    except KeyboardInterrupt:
        pass


# -- progress display ---------------------------------------------------------------
_STATE_STYLE = {"pending": "dim", "running": "cyan", "success": "green", "failed": "red",
                "canceled": "yellow"}


def _bar(done: int, total: int, width: int = 30) -> str:
    filled = int(width * done / total) if total else width
    return "█" * filled + "░" * (width - filled)


def job_table(job: dict[str, Any]) -> Table:
    counts = job["counts"]
    total = job["total"]
    done = counts["success"] + counts["failed"] + counts["canceled"]
    table = Table(title=f"job {job['name']} ({job['id'][:8]}): {job['state']}", expand=False)
    table.add_column("lane")
    table.add_column("progress")
    table.add_column("pending", justify="right")
    table.add_column("running", justify="right")
    table.add_column("success", justify="right", style="green")
    table.add_column("failed", justify="right", style="red")
    table.add_column("eta", justify="right")
    lanes: dict[str, dict[str, Any]] = {}
    for task in job.get("tasks", []):
        lane = task["account"] if task["state"] != "pending" and task["account"] else task["model"]
        lane = f"{task['kind']}:{lane}"
        row = lanes.setdefault(lane, {"pending": 0, "running": 0, "success": 0, "failed": 0,
                                      "canceled": 0, "eta": 0.0})
        row[task["state"]] += 1
        if task.get("eta_s"):
            row["eta"] = max(row["eta"], task["eta_s"])
    for lane, row in sorted(lanes.items()):
        lane_total = sum(row[s] for s in ("pending", "running", "success", "failed", "canceled"))
        lane_done = row["success"] + row["failed"] + row["canceled"]
        table.add_row(lane, f"{_bar(lane_done, lane_total, 16)} {lane_done}/{lane_total}",
                      str(row["pending"]), str(row["running"]), str(row["success"]),
                      str(row["failed"]), f"{row['eta']:.0f}s" if row["eta"] else "-")
    table.add_row("[b]all[/b]", f"{_bar(done, total, 16)} {done}/{total}", str(counts["pending"]),
                  str(counts["running"]), str(counts["success"]), str(counts["failed"]), "")
    return table


def failures_table(job: dict[str, Any]) -> Table:
    table = Table(title="failed tasks")
    for column in ("task", "model", "attempt", "error"):
        table.add_column(column)
    for task in job.get("tasks", []):
        if task["state"] == "failed":
            error = task["error"] or {}
            table.add_row(task["id"][:8], task["model"], f"{task['attempt']}/{task['max_attempts']}",
                          f"{error.get('kind')}: {error.get('message')}")
    return table


def watch_job(client: Client, job_id: str, *, as_json: bool = False, interval_s: float = 0.5) -> dict[str, Any]:
    seen_failures: set[str] = set()
    job: dict[str, Any] = client.get(f"/v1/jobs/{job_id}")
    if as_json:
        while job["state"] == "running":
            time.sleep(interval_s)
            job = client.get(f"/v1/jobs/{job_id}")
        return job
    with Live(job_table(job), console=console, refresh_per_second=4, transient=False) as live:
        while True:
            for task in job["tasks"]:
                if task["state"] == "failed" and task["id"] not in seen_failures:
                    seen_failures.add(task["id"])
                    error = task["error"] or {}
                    live.console.print(f"[red]failed[/red] {task['id'][:8]} {task['model']}: "
                                       f"{error.get('kind')}: {error.get('message')}")
            live.update(job_table(job))
            if job["state"] != "running":
                break
            time.sleep(interval_s)
            job = client.get(f"/v1/jobs/{job_id}")
    return job


# -- commands -------------------------------------------------------------------------
@app.command()
def submit(
    model: Annotated[str, typer.Argument(help="Model name (a profile).")],
    prompt: Annotated[str, typer.Argument(help="The prompt.")],
    param: Annotated[list[str] | None, typer.Option("--param", "-p", help="KEY=VALUE (JSON values parsed).")] = None,
    force: Annotated[bool, typer.Option(help="Bypass de-duplication and the cache.")] = False,
    wait: Annotated[bool, typer.Option(help="Show progress until the task ends.")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Submit one task and print its id."""
    params: dict[str, Any] = {"prompt": prompt}
    for item in param or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            err.print(f"[red]error:[/red] --param takes KEY=VALUE, got {item!r}")
            raise typer.Exit(2)
        try:
            params[key] = json.loads(value)
        except json.JSONDecodeError:
            params[key] = value
    with _client() as client:
        try:
            task = client.post("/v1/tasks", {"model": model, "params": params, "force": force})
            if wait:
                task = _wait_task(client, task, as_json)
        except DispatcherError as exc:
            raise _fail(exc) from exc
    if as_json:
        _print_json(task)
    else:
        note = " (deduped)" if task["deduped"] else " (from cache)" if task["from_cache"] else ""
        console.print(f"{task['id']}{note}" if not wait else
                      f"{task['id']}: {task['state']}" + (f" — {task['error']['message']}" if task["error"] else ""))
    if wait and task["state"] != "success":
        raise typer.Exit(1)


def _wait_task(client: Client, task: dict[str, Any], quiet: bool) -> dict[str, Any]:
    from rich.progress import Progress

    with Progress(console=err, transient=True, disable=quiet) as progress:
        bar = progress.add_task(f"{task['model']} {task['id'][:8]}", total=100)
        while task["state"] in ("pending", "running"):
            desc = f"{task['model']} {task['id'][:8]} {task['state']}"
            if task["state"] == "pending":
                desc += f" ({task['ahead']} ahead)"
            progress.update(bar, description=desc, completed=task.get("progress") or 0)
            time.sleep(0.3)
            task = client.get(f"/v1/tasks/{task['id']}")
        progress.update(bar, completed=100)
    return task


@app.command()
def batch(
    file: Annotated[Path, typer.Argument(help="JSONL or CSV of tasks.")],
    name: Annotated[str | None, typer.Option(help="Job name (default: the file name).")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Submit a batch file as one job and watch it; non-zero exit if any task failed."""
    try:
        tasks = read_batch(file)
    except DispatcherError as exc:
        raise _fail(exc) from exc
    with _client() as client:
        try:
            job = client.post("/v1/jobs", {"name": name or file.stem, "tasks": tasks})
            job = watch_job(client, job["id"], as_json=as_json)
        except DispatcherError as exc:
            raise _fail(exc) from exc
    if as_json:
        _print_json(job)
    elif job["counts"]["failed"]:
        console.print(failures_table(job))
    if job["counts"]["failed"] or job["counts"]["canceled"]:
        raise typer.Exit(1)


@app.command()
def status(task_or_job: str, as_json: JsonFlag = False) -> None:
    """Show a task or a job."""
    with _client() as client:
        try:
            data = client.get(f"/v1/tasks/{task_or_job}")
            kind = "task"
        except DispatcherError:
            try:
                data = client.get(f"/v1/jobs/{task_or_job}")
                kind = "job"
            except DispatcherError as exc:
                raise _fail(exc) from exc
    if as_json:
        _print_json(data)
    elif kind == "job":
        console.print(job_table(data))
    else:
        table = Table(show_header=False)
        for key in ("id", "model", "kind", "account", "state", "stage", "attempt", "ahead",
                    "eta_s", "progress", "error", "result"):
            value = data.get(key)
            table.add_row(key, json.dumps(value) if isinstance(value, dict) else str(value))
        console.print(table)


def _act(path: str, as_json: bool) -> None:
    data = _call("POST", path)
    if as_json:
        _print_json(data)
    else:
        console.print(f"{data['id']}: {data['state']}")


@app.command()
def cancel(task_or_job: str, as_json: JsonFlag = False) -> None:
    """Cancel a task or a job (its pending and running tasks)."""
    with _client() as client:
        try:
            client.get(f"/v1/tasks/{task_or_job}")
            path = f"/v1/tasks/{task_or_job}/cancel"
        except DispatcherError:
            path = f"/v1/jobs/{task_or_job}/cancel"
    _act(path, as_json)


@app.command()
def retry(task_or_job: str, as_json: JsonFlag = False) -> None:
    """Retry a failed task, or a job's failed tasks."""
    with _client() as client:
        try:
            client.get(f"/v1/tasks/{task_or_job}")
            path = f"/v1/tasks/{task_or_job}/retry"
        except DispatcherError:
            path = f"/v1/jobs/{task_or_job}/retry"
    _act(path, as_json)


@accounts_app.callback(invoke_without_command=True)
def accounts_list(ctx: typer.Context, as_json: JsonFlag = False) -> None:
    """List accounts and providers."""
    if ctx.invoked_subcommand is not None:
        return
    data = _call("GET", "/v1/accounts")
    if as_json:
        _print_json(data)
        return
    table = Table("name", "kind", "enabled", "needs attention", "reason")
    for account in data:
        table.add_row(account["name"], account["kind"], "yes" if account["enabled"] else "[red]no[/red]",
                      "[red]yes[/red]" if account["needs_attention"] else "no", account["reason"] or "")
    console.print(table)


@accounts_app.command("disable")
def accounts_disable(
    name: str,
    reason: Annotated[str, typer.Option(help="Why (shown to the team).")],
    as_json: JsonFlag = False,
) -> None:
    data = _call("POST", f"/v1/accounts/{name}/disable", {"reason": reason})
    _print_json(data) if as_json else console.print(f"{name}: disabled ({reason})")


@accounts_app.command("enable")
def accounts_enable(name: str, as_json: JsonFlag = False) -> None:
    data = _call("POST", f"/v1/accounts/{name}/enable")
    _print_json(data) if as_json else console.print(f"{name}: enabled")


@app.command()
def lanes(as_json: JsonFlag = False) -> None:
    """Lanes with concurrency, queue depth and running tasks."""
    data = _call("GET", "/v1/lanes")
    if as_json:
        _print_json(data)
        return
    table = Table("lane", "concurrency", "enabled", "queued", "running")
    for lane in data:
        state = "yes" if lane["enabled"] and not lane["needs_attention"] else f"[red]no[/red] {lane['reason'] or ''}"
        table.add_row(lane["name"], str(lane["concurrency"]), state, str(lane["queued"]),
                      ", ".join(t[:8] for t in lane["running"]) or "-")
    console.print(table)


@app.command()
def dashboard() -> None:
    """Print a dashboard URL carrying a one-time code (valid 2 minutes, once)."""
    with _client() as client:
        try:
            code = client.post("/v1/dashboard-code")["code"]
        except DispatcherError as exc:
            raise _fail(exc) from exc
        console.print(f"{client.base_url}/v1/session?code={code}")


@app.command("demo-run")
def demo_run(
    exit_when_done: Annotated[bool, typer.Option(help="Stop once the sample batch ends.")] = False,
    batch_file: Annotated[Path, typer.Option(help="The sample batch.")] = BATCH_SAMPLE,
) -> None:
    """Serve with the demo backends, run a sample batch to completion, keep serving."""
    from dispatcher.service import Service

    settings = _settings(demo=True)
    setup_logging("WARNING", settings.log_format)

    def drive(url: str) -> str:
        # A thread of its own: the blocking client must not stall the service's loop.
        with Client(settings.state_dir) as client:
            code = client.post("/v1/dashboard-code")["code"]
            console.print(f"dispatcher running on {url} (state dir {settings.state_dir})")
            console.print(f"dashboard: {url}/v1/session?code={code}")
            job = client.post("/v1/jobs", {"name": "demo", "tasks": read_batch(batch_file)})
            job = watch_job(client, job["id"])
            if job["counts"]["failed"]:
                console.print(failures_table(job))
            return str(job["state"])

    async def run() -> int:
        service = Service(settings)
        await service.start()
        try:
            state = await asyncio.to_thread(drive, service.url)
            console.print(f"sample batch finished: {state}")
            if exit_when_done:
                return 0 if state == "success" else 1
            console.print("still serving; try `.venv/bin/python -m dispatcher batch "
                          "demo/sample-batch.jsonl` in another shell. Ctrl-C stops.")
            await asyncio.Event().wait()
            return 0
        finally:
            await service.stop()

    try:
        code = asyncio.run(run())
    except KeyboardInterrupt:
        code = 0
    except DispatcherError as exc:
        raise _fail(exc) from exc
    raise typer.Exit(code)


def main() -> None:
    app()
