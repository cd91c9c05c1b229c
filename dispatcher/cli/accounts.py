"""Lane switches: list, disable and enable accounts and providers; show the lanes."""

from __future__ import annotations

import time
from typing import Annotated
from urllib.parse import quote

import typer
from rich.markup import escape
from rich.table import Table

from dispatcher.cli.output import JsonFlag, console, print_json
from dispatcher.cli.plumbing import service_client

accounts_app = typer.Typer(help="List, disable and enable web accounts and API providers.")


@accounts_app.callback(invoke_without_command=True)
def accounts_list(ctx: typer.Context, as_json: JsonFlag = False) -> None:
    """List accounts and providers with their switches."""
    if ctx.invoked_subcommand is not None:
        return
    with service_client(as_json) as client:
        data = client.get("/v1/accounts")
    if as_json:
        print_json(data)
        return
    table = Table("name", "kind", "state", "reason", "since")
    for account in data:
        table.add_row(
            escape(account["name"]),
            account["kind"],
            _state_text(account),
            escape(account["reason"] or ""),
            time.strftime("%Y-%m-%d %H:%M", time.localtime(account["updated_at"]))
            if account.get("updated_at")
            else "",
        )
    console.print(table)


@accounts_app.command("disable")
def accounts_disable(
    name: Annotated[str, typer.Argument(help="A web account or API provider.")],
    reason: Annotated[str, typer.Option("--reason", help="Why (shown to the team).")],
    as_json: JsonFlag = False,
) -> None:
    """Disable a lane (it finishes its running task)."""
    with service_client(as_json) as client:
        data = client.post(f"/v1/accounts/{quote(name, safe='')}/disable", {"reason": reason})
    if as_json:
        print_json(data)
    else:
        console.print(f"{escape(name)}: disabled ({escape(data['reason'] or '')})")


@accounts_app.command("enable")
def accounts_enable(
    name: Annotated[str, typer.Argument(help="A web account or API provider.")],
    as_json: JsonFlag = False,
) -> None:
    """Enable a lane (also clears needs-attention)."""
    with service_client(as_json) as client:
        data = client.post(f"/v1/accounts/{quote(name, safe='')}/enable")
    if as_json:
        print_json(data)
    else:
        console.print(f"{escape(name)}: enabled")


def _state_text(item: dict[str, object]) -> str:
    """ok, cooldown (until when), needs attention, disabled: red unless ok."""
    state = str(item.get("state") or "ok")
    until = item.get("until")
    if state == "ok":
        return "ok"
    text = state.replace("_", " ")
    if state == "cooldown" and isinstance(until, int | float):
        text += time.strftime(" until %H:%M:%S", time.localtime(until))
    return f"[red]{text}[/red]"


def lanes(as_json: JsonFlag = False) -> None:
    """Lanes with concurrency, queue depth and running tasks."""
    with service_client(as_json) as client:
        data = client.get("/v1/lanes")
    if as_json:
        print_json(data)
        return
    table = Table("lane", "models", "concurrency", "state", "queued", "running")
    for lane in data:
        state = _state_text(lane)
        if lane.get("reason"):
            state += f" {escape(lane['reason'])}"
        effective = lane.get("effective_concurrency", lane["concurrency"])
        concurrency = str(lane["concurrency"])
        if effective != lane["concurrency"]:
            concurrency = f"{effective} of {concurrency} (429s)"
        table.add_row(
            escape(lane["name"]),
            escape(", ".join(lane["models"])),
            concurrency,
            state,
            str(lane["queued"]),
            ", ".join(lane["running"]) or "-",
        )
    console.print(table)
