"""The command tree: the root app, its global options, and which command goes where.

Commands are registered here, in the order `--help` lists them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dispatcher.cli import accounts, server, tasks
from dispatcher.cli.plumbing import options
from dispatcher.cli.server import DemoFlag, LogFormat, LogLevel, PortOption

app = typer.Typer(
    add_completion=False,
    no_args_is_help=False,
    rich_markup_mode=None,
    help="Run AI-generation tasks against web and API models, each in its own lane. "
    "With no command: serve until SIGTERM.",
    epilog="Exit codes: 0 ok, 1 a task/job failed or the request was refused, 2 bad input, "
    "3 the service is not running or the token is stale, 130 interrupted.",
)
app.add_typer(accounts.accounts_app, name="accounts")


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
app.command()(tasks.submit)
app.command()(tasks.batch)
app.command()(tasks.status)
app.command()(tasks.cancel)
app.command()(tasks.retry)
app.command()(accounts.lanes)
app.command()(server.dashboard)
app.command("demo-run")(server.demo_run)


def main() -> None:
    app()
