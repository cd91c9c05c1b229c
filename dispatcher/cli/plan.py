"""`dispatcher plan`: what a batch would cost and take, before it runs; and the
limits `dispatcher batch --max-cost --deadline` checks before submitting."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from dispatcher.cli.output import JsonFlag, console, fmt_seconds, print_json
from dispatcher.cli.plumbing import EXIT_FAILED, fail, handled, service_client
from dispatcher.cli.service_client import ApiError, Client
from dispatcher.errors import InputError
from dispatcher.tasks.batchfile import BatchLine, locate, read_batch_lines
from dispatcher.tasks.spec import parse_deadline

_CLOCK = re.compile(r"^([01]?\d|2[0-3]):([0-5]\d)$")

MaxCost = Annotated[
    float | None,
    typer.Option("--max-cost", min=0, help="Refuse when the estimated cost is over these dollars."),
]
Deadline = Annotated[
    str | None,
    typer.Option(
        "--deadline",
        help="Refuse when the estimate ends after then: HH:MM (next time this clock "
        "shows it, local time) or an ISO 8601 time.",
    ),
]


def deadline_of(text: str | None, now: datetime | None = None) -> float | None:
    """--deadline as epoch seconds: "09:00" is the next 09:00 on this machine's clock."""
    if text is None:
        return None
    match = _CLOCK.match(text.strip())
    if match is None:
        try:
            return parse_deadline(text, "option")
        except InputError:
            raise InputError(
                f"--deadline {text[:40]!r} is neither HH:MM nor an ISO 8601 time "
                "(2026-12-04T09:00:00Z)"
            ) from None
    now = now or datetime.now().astimezone()
    moment = now.replace(hour=int(match[1]), minute=int(match[2]), second=0, microsecond=0)
    if moment <= now:
        moment += timedelta(days=1)
    return moment.timestamp()


def request_plan(
    client: Client,
    file: Path,
    lines: list[BatchLine],
    max_cost_usd: float | None = None,
    deadline: float | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {"tasks": [line.task for line in lines]}
    if max_cost_usd is not None:
        body["max_cost_usd"] = max_cost_usd
    if deadline is not None:
        body["deadline"] = deadline
    try:
        answer: dict[str, Any] = client.post("/v1/plan", body)
    except ApiError as exc:
        if exc.status == 400:
            raise InputError(locate(str(exc), file, lines)) from exc
        raise
    return answer


def _usd(value: float | None) -> str:
    return "-" if value is None else f"${value:,.2f}"


def _cost(row: dict[str, Any]) -> str:
    unpriced = f" (+{row['unpriced']} unpriced)" if row["unpriced"] else ""
    return _usd(row["cost_usd"]) + unpriced


def show_plan(plan: dict[str, Any]) -> None:
    table = Table(show_edge=False, pad_edge=False)
    for column in ("model", "tasks", "dedup", "cached", "to run", "cost", "estimate", "bound"):
        table.add_column(column)
    for row in plan["models"]:
        table.add_row(
            escape(row["model"]),
            str(row["tasks"]),
            str(row["duplicates"] + row["twins"]),
            str(row["cached"]),
            str(row["to_run"]),
            _cost(row),
            fmt_seconds(row.get("estimate_s")),
            escape(row.get("bound") or ""),
        )
    total = plan["total"]
    table.add_row(
        "total",
        str(total["tasks"]),
        str(total["deduplicated"]),
        str(total["cached"]),
        str(total["to_run"]),
        _usd(total["cost_usd"])
        + (f" (+{total['unpriced']} unpriced)" if total["unpriced"] else ""),
        fmt_seconds(total["makespan_s"]),
        f"lower bound {fmt_seconds(total['lower_bound_s'])}",
    )
    console.print(table)
    if total["makespan_s"] is None:
        console.print(
            f"makespan unknown: {escape(total['bound'])} (run a few of its tasks first, "
            "or state `expected_run_s` in its profile)"
        )
    else:
        console.print(
            f"makespan ~{fmt_seconds(total['makespan_s'])}, lower bound "
            f"{fmt_seconds(total['lower_bound_s'])} set by {escape(total['bound'])}"
        )
    for row in plan["models"]:
        if row.get("per_day") is not None:
            console.print(
                f"{escape(row['model'])}: at most {row['per_day']} a day (its accounts' allowances)"
            )
    for stop in plan["stops"]:
        console.print(f"[yellow]{escape(stop)}[/]")
    for refusal in plan["refusals"]:
        console.print(f"[red]cannot meet: {escape(refusal)}[/]")


def check_limits(
    client: Client,
    file: Path,
    lines: list[BatchLine],
    max_cost_usd: float | None,
    deadline: float | None,
    *,
    as_json: bool,
) -> None:
    """`batch --max-cost/--deadline`: refuse (exit 1, with the reasons) a batch
    whose plan cannot meet them; nothing is submitted."""
    answer = request_plan(client, file, lines, max_cost_usd, deadline)
    if answer["ok"]:
        return
    reasons = "; ".join(answer["refusals"])
    fail(
        f"batch refused, nothing submitted: {reasons} (--ignore-limits submits it anyway)",
        EXIT_FAILED,
        "refused",
    )


def plan(
    file: Annotated[Path, typer.Argument(help="JSONL or CSV of tasks.")],
    max_cost: MaxCost = None,
    deadline: Deadline = None,
    as_json: JsonFlag = False,
) -> None:
    """Plan a batch without submitting it: per model and in total, the tasks,
    de-duplicated and cached ones, estimated cost and makespan (its lower bound
    named), and which budget would stop it. Exit 1 when --max-cost or
    --deadline cannot be met."""
    with handled(as_json):
        lines = read_batch_lines(file)
        when = deadline_of(deadline)
    with service_client(as_json) as client:
        answer = request_plan(client, file, lines, max_cost, when)
    if as_json:
        print_json(answer)
    else:
        show_plan(answer)
    if not answer["ok"]:
        raise typer.Exit(EXIT_FAILED)
