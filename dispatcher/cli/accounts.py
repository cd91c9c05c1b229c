"""Lane switches: list, disable and enable accounts and providers; show the lanes and hosts."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

import typer
from rich.markup import escape
from rich.table import Table

from dispatcher.cli.output import JsonFlag, console, err, fitted, fmt_seconds, print_json
from dispatcher.cli.plumbing import EXIT_FAILED, EXIT_USAGE, fail, handled, service_client

accounts_app = typer.Typer(
    help="List, disable and enable web accounts and API providers; log web accounts in."
)
# Starting a browser and loading the model's page take real seconds.
LOGIN_TIMEOUT_S = 120.0


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


@accounts_app.command("add")
def accounts_add(
    name: Annotated[str, typer.Argument(help="The web account (names its browser profile).")],
    models: Annotated[
        list[str], typer.Option("--model", help="A loaded web model it serves (repeatable).")
    ],
    as_json: JsonFlag = False,
) -> None:
    """Add a web account while serving; it takes tasks at once (log it in first)."""
    with service_client(as_json) as client:
        data = client.post("/v1/accounts", {"name": name, "models": models})
    if as_json:
        print_json(data)
    else:
        console.print(f"{escape(name)}: added, serving {escape(', '.join(data['models']))}")


@accounts_app.command("remove")
def accounts_remove(
    name: Annotated[str, typer.Argument(help="A web account added with `accounts add`.")],
    drain: Annotated[
        bool, typer.Option("--drain", help="If it runs a task: no new ones, gone when it ends.")
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Remove a web account added at run time (refused while it runs a task, unless --drain)."""
    path = f"/v1/accounts/{quote(name, safe='')}" + ("?drain=true" if drain else "")
    with service_client(as_json) as client:
        data = client.delete(path)
    if as_json:
        print_json(data)
    elif data["draining"]:
        console.print(
            f"{escape(name)}: draining; removed when task {', '.join(data['running'])} ends"
        )
    else:
        console.print(f"{escape(name)}: removed")


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


@accounts_app.command("login")
def accounts_login(
    name: Annotated[str, typer.Argument(help="A web account.")],
    as_json: JsonFlag = False,
) -> None:
    """Open the account's browser profile and print a one-time link to see and drive it.

    The link opens the dashboard's login page (through the same SSH tunnel as
    the dashboard): log in there, then press Done. The account's tasks wait
    meanwhile; Cancel, or 15 minutes without input, closes it unchanged.
    """
    with service_client(as_json) as client:
        client.timeout_s = LOGIN_TIMEOUT_S
        opened = client.post(f"/v1/accounts/{quote(name, safe='')}/login")
        code = client.post("/v1/dashboard-code")["code"]
        url = f"{client.base_url}/v1/session?code={code}&next={quote(opened['path'], safe='/')}"
        port = client.port
    if as_json:
        print_json({**opened, "url": url})
        return
    print(url, flush=True)
    err.print(
        f"browser pid {opened['browser_pid']} holds {escape(name)}'s profile. Open the link "
        f"within 2 minutes (it works once); from another machine, tunnel first: "
        f"ssh -N -L {port}:127.0.0.1:{port} <this host>"
    )


@accounts_app.command("import")
def accounts_import(
    name: Annotated[str, typer.Argument(help="A web account.")],
    file: Annotated[
        Path,
        typer.Argument(help="A Playwright storage-state JSON or a Netscape cookies.txt."),
    ],
    as_json: JsonFlag = False,
) -> None:
    """Load a session file's cookies into the account's profile and check the login.

    Exit 0 when the model's page shows it logged in (the account is enabled
    and its logged-out tasks queued again), 1 when it still shows the login
    form, 2 for a file that cannot be read or parsed.
    """
    text = _read_session_file(file, as_json)
    with service_client(as_json) as client:
        client.timeout_s = LOGIN_TIMEOUT_S
        data = client.post(f"/v1/accounts/{quote(name, safe='')}/import", {"text": text})
    if as_json:
        print_json(data)
    dropped = data.get("dropped") or 0
    others = f", {dropped} for other sites dropped" if dropped else ""
    if not data["logged_in"]:
        if not as_json:
            err.print(
                f"{escape(name)}: imported {data['cookies']} cookie(s){others}, but the page "
                "still shows the login form; the account is unchanged"
            )
        raise typer.Exit(EXIT_FAILED)
    if not as_json:
        # Tasks that met the logout waited, pending; only ones an older
        # version failed with `auth` need queueing again.
        failed = len(data["requeued"])
        again = f"; {failed} failed task(s) queued again" if failed else ""
        console.print(
            f"{escape(name)}: logged in ({data['cookies']} cookie(s) imported{others}); "
            f"account enabled, its waiting tasks run{again}"
        )


def _read_session_file(file: Path, as_json: bool) -> str:
    """The file's text, if it is a regular file the service would take (exit 2 if not).

    Refused here when too large, as a bad file, rather than sent to be
    refused as HTTP 413 (which would exit 1, like a failed login).
    """
    import json

    from dispatcher.http.bodies import MAX_SESSION_FILE_CHARS
    from dispatcher.http.limits import MAX_BODY_BYTES
    from dispatcher.tasks.inputfiles import read_regular_file

    with handled(as_json):
        raw = read_regular_file(file, MAX_SESSION_FILE_CHARS, "a session file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        fail(f"cannot read {file}: {exc}", EXIT_USAGE, "invalid")
    if len(json.dumps({"text": text})) > MAX_BODY_BYTES:
        fail(
            f"{file} is too large to import (the limit: {MAX_SESSION_FILE_CHARS:,} characters, "
            f"{MAX_BODY_BYTES:,} bytes as sent); export only the model's site's cookies",
            EXIT_USAGE,
            "invalid",
        )
    return text


def lanes(as_json: JsonFlag = False) -> None:
    """Lanes with concurrency, queue depth and running tasks."""
    with service_client(as_json) as client:
        data = client.get("/v1/lanes")
    if as_json:
        print_json(data)
        return
    table = Table()
    # Names and ids wrap whole rather than end in "…" on a narrow terminal.
    table.add_column("lane", no_wrap=True)
    for column in ("models", "concurrency", "state", "queued", "running", "browser"):
        table.add_column(column, overflow="fold")
    budget_mb = next(
        (lane["browser_memory_budget_mb"] for lane in data if lane.get("browser_memory_budget_mb")),
        None,
    )
    held_mb = sum(lane.get("browser_memory_mb") or 0.0 for lane in data)
    for lane in data:
        effective = lane.get("effective_concurrency", lane.get("concurrency"))
        concurrency = str(lane.get("concurrency", "-"))
        if effective != lane.get("concurrency"):
            concurrency = f"{effective} of {concurrency} (429s)"
        if lane.get("invalid"):
            state = f"[red]invalid[/red] {escape(lane['invalid'])}"
        else:
            state = _state_text(lane)
            if lane.get("reason"):
                state += f" {escape(lane['reason'])}"
        table.add_row(
            escape(lane["name"]),
            escape(", ".join(lane["models"])),
            concurrency,
            state,
            str(lane["queued"]),
            ", ".join(lane["running"]) or "-",
            _browser_text(lane),
        )
    console.print(table)
    if budget_mb is not None:
        console.print(
            f"browsers: {held_mb:,.0f} MB of a {budget_mb:,.0f} MB budget for the service "
            "and its browsers (PSS)"
        )


def _browser_text(lane: dict[str, Any]) -> str:
    """A web lane's open browser, by its memory; "-" for none (or an API lane)."""
    size = lane.get("browser_memory_mb")
    return "-" if size is None else f"{size:,.0f} MB"


# What a narrow terminal leaves out first (ranks as in output.fitted).
HOST_COLUMNS = (
    ("host", 0),
    ("state", 0),
    ("last beat", 0),
    ("started", 2),
    ("accounts leased", 0),
    ("running", 0),
    ("url", 0),
)


def hosts(as_json: JsonFlag = False) -> None:
    """The hosts sharing the database: last beat, accounts leased, running tasks."""
    with service_client(as_json) as client:
        data = client.get("/v1/hosts")
    if as_json:
        print_json(data)
        return
    columns = fitted(HOST_COLUMNS, console.width)
    table = Table()
    for column, _ in columns:
        # Wrapped, never cut: a host id or url ending in "…" names nothing.
        table.add_column(column, overflow="fold")
    for host in data:
        state = {"alive": "[green]alive[/green]", "silent": "[yellow]silent[/yellow]"}.get(
            host["state"], "[red]dead[/red]"
        )
        cells = {
            "host": escape(host["host"]) + (" (this host)" if host["this_host"] else ""),
            "state": state,
            "last beat": f"{fmt_seconds(host['silent_s'])} ago",
            "started": time.strftime("%Y-%m-%d %H:%M", time.localtime(host["started_at"])),
            "accounts leased": escape(", ".join(host["accounts"])) or "-",
            "running": str(host["running"]),
            "url": escape(host["url"] or "-"),
        }
        table.add_row(*(cells[column] for column, _ in columns))
    console.print(table)


def reload(as_json: JsonFlag = False) -> None:
    """Re-read the profiles and live settings (same as SIGHUP); print what changed.

    Exit 1 when the settings were refused (the running ones stay).
    """
    with service_client(as_json) as client:
        data = client.post("/v1/reload")
    if as_json:
        print_json(data)
    else:
        _print_reload(data)
    if data.get("settings_error"):
        raise typer.Exit(EXIT_FAILED)


def _print_reload(data: dict[str, Any]) -> None:
    for what in ("added", "removed", "changed"):
        if data[what]:
            console.print(f"{what}: {escape(', '.join(data[what]))}")
    for model, why in sorted(data["refused"].items()):
        console.print(f"[yellow]not applied[/yellow] {escape(model)}: {escape(why)}")
    for problem in data["invalid_profiles"]:
        console.print(
            f"[red]invalid[/red] {escape(problem['file'])}: `{escape(problem['key'])}`: "
            f"{escape(problem['why'])}"
        )
    sources = data.get("settings_sources") or {}
    for name, value in sorted((data.get("settings") or {}).items()):
        variable = f"DISPATCHER_{name.upper()}"
        where = sources.get(name) or [{"variable": variable, "source": "its default"}]
        console.print(
            f"setting changed: {escape(where[0]['variable'])} = {escape(str(value))} "
            f"(from {escape(where[0]['source'])})"
        )
    if data.get("settings_error"):
        err.print(
            f"[red]settings refused[/red] (the running ones stay): {escape(data['settings_error'])}"
        )
    for _name, where in sorted(sources.items()):
        if len(where) > 1:
            used, *ignored = where
            others = "; ".join(f"{o['value']} in {o['source']}" for o in ignored)
            console.print(
                f"[yellow]note[/yellow] {escape(used['variable'])}: {escape(used['value'])} "
                f"from {escape(used['source'])} wins over {escape(others)}"
            )
    if not any(
        data.get(w)
        for w in ("added", "removed", "changed", "refused", "invalid_profiles", "settings")
    ) and not data.get("settings_error"):
        console.print("no changes")
    console.print(f"models loaded: {escape(', '.join(data['models']))}")
