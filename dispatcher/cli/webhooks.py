"""Webhook deliveries kept in the outbox: list them, send a failed one again."""

from __future__ import annotations

import time
from enum import StrEnum
from typing import Annotated
from urllib.parse import quote, urlencode

import typer
from rich.markup import escape
from rich.table import Table

from dispatcher.cli.output import JsonFlag, console, print_json
from dispatcher.cli.plumbing import service_client

webhooks_app = typer.Typer(
    help="Webhook deliveries not delivered yet or given up: list them, redeliver failed ones."
)


class OutboxState(StrEnum):
    pending = "pending"
    delivering = "delivering"
    failed = "failed"


@webhooks_app.command("deliveries")
def webhooks_deliveries(
    state: Annotated[
        OutboxState | None, typer.Option("--state", help="Only these (default: all).")
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=500, help="How many, at most.")] = 100,
    as_json: JsonFlag = False,
) -> None:
    """List deliveries waiting, under way or given up (newest first)."""
    query = {"limit": str(limit), **({"state": state.value} if state else {})}
    with service_client(as_json) as client:
        data = client.get(f"/v1/webhooks/outbox?{urlencode(query)}")
    if as_json:
        print_json(data)
        return
    table = Table("id", "event", "receiver", "state", "attempts", "last", "created")
    for item in data["items"]:
        last = item["last_error"] or (f"HTTP {item['last_status']}" if item["last_status"] else "")
        table.add_row(
            item["id"],
            item["event"],
            escape(item["url"]),
            f"[red]{item['state']}[/red]" if item["state"] == "failed" else item["state"],
            str(item["attempts"]),
            escape(last),
            time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(item["created_at"])),
        )
    console.print(table)


@webhooks_app.command("redeliver")
def webhooks_redeliver(
    delivery_id: Annotated[str, typer.Argument(help="A failed delivery's id (from `deliveries`).")],
    as_json: JsonFlag = False,
) -> None:
    """Send a failed delivery again, with a fresh budget of attempts."""
    with service_client(as_json) as client:
        data = client.post(f"/v1/webhooks/outbox/{quote(delivery_id, safe='')}/redeliver")
    if as_json:
        print_json(data)
    else:
        console.print(f"{data['id']}: {data['event']} to {escape(data['url'])} is pending again")
