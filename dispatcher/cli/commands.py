"""The command tree: the root app, its global options, and which command goes where.

Commands are registered here, in the order `--help` lists them.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from typer.exceptions import TyperException

from dispatcher.cli import (
    accounts,
    history,
    plan,
    profiles_catalog,
    profiletry,
    results,
    server,
    tasks,
    webhooks,
)
from dispatcher.cli.plumbing import EXIT_INTERRUPTED, EXIT_USAGE, options, report
from dispatcher.cli.server import DemoFlag, LogFormat, LogLevel, PortOption

app = typer.Typer(
    add_completion=False,
    no_args_is_help=False,
    rich_markup_mode=None,
    help="Run AI-generation tasks against web and API models, each in its own lane. "
    "With no command: serve until SIGTERM.",
    epilog="Ids: a task or job id, or a unique prefix of it (4+ characters). "
    "Exit codes: 0 ok, 1 a task/job failed or the request was refused, 2 bad input "
    "(also an unknown model or id), 3 the service is not running or the token is stale, "
    "130 interrupted. With --json, stdout is one JSON object, errors included.",
)
app.add_typer(accounts.accounts_app, name="accounts")
app.add_typer(webhooks.webhooks_app, name="webhooks")
app.add_typer(profiles_catalog.profiles_app, name="profiles")
profiles_catalog.profiles_app.command("try")(profiletry.profiles_try)


@app.callback(invoke_without_command=True)
def main_callback(
    ctx: typer.Context,
    demo: DemoFlag = False,
    port: PortOption = None,
    log_format: LogFormat = None,
    log_level: LogLevel = None,
    state_dir: Annotated[
        Path | None,
        typer.Option(
            "--state-dir", help="The service's state dir (default: DISPATCHER_STATE_DIR)."
        ),
    ] = None,
) -> None:
    options["state_dir"] = state_dir
    if ctx.invoked_subcommand is None:
        server.serve(demo=demo, port=port, log_format=log_format, log_level=log_level)


app.command()(server.serve)
app.command()(server.migrate)
app.command()(tasks.submit)
app.command()(plan.plan)
app.command()(tasks.batch)
app.command()(tasks.status)
app.command()(history.jobs)
app.command()(history.tasks)
app.command()(results.results)
app.command()(tasks.cancel)
app.command()(tasks.retry)
app.command()(accounts.lanes)
app.command()(accounts.hosts)
app.command()(server.dashboard)
app.command()(server.check)
app.command()(accounts.reload)
app.command("demo-run")(server.demo_run)


def main() -> None:
    args = sys.argv[1:]
    options["json"] = "--json" in args[: args.index("--")] if "--" in args else "--json" in args
    if not options["json"]:
        app()
        return
    # With --json even a usage error (an unknown option, a missing argument)
    # is a JSON object on stdout, so scripts need to parse one thing only.
    try:
        code = app(standalone_mode=False)
    except typer.Exit as exc:  # raised by our own `fail` above the command
        code = exc.exit_code
    except TyperException as exc:  # click's usage errors, as vendored by typer
        format_message = getattr(exc, "format_message", None)
        report(format_message() if callable(format_message) else str(exc), EXIT_USAGE, "usage")
        code = EXIT_USAGE
    except typer.Abort:
        code = EXIT_INTERRUPTED
    raise SystemExit(code if isinstance(code, int) else 0)
