"""`dispatcher profiles try MODEL "prompt"`: one prompt through a web profile, in the foreground.

The way to write a profile for a site the project has never seen (see
docs/profiles.md, "Writing a profile for a site"): no service needed, and
none may hold the account (its browser profile is locked while this runs).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from dispatcher.cli.output import console
from dispatcher.cli.plumbing import EXIT_FAILED, EXIT_OK, EXIT_USAGE, fail, handled, options
from dispatcher.cli.plumbing import load_settings as _load_settings


# Registered as `dispatcher profiles try` beside the catalog (cli/commands.py).
def profiles_try(
    model: Annotated[str, typer.Argument(help="A web model (a profile in the profiles dir).")],
    prompt: Annotated[str, typer.Argument(help="The prompt to send.")],
    param: Annotated[
        list[str] | None,
        typer.Option("--param", "-p", help="KEY=VALUE for a [web.fields] entry, repeatable."),
    ] = None,
    account: Annotated[
        str | None, typer.Option("--account", help="The account (default: the model's first).")
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option("--out", help="Folder for the screenshots (default: ./try-<model>)."),
    ] = None,
    profiles_dir: Annotated[
        Path | None,
        typer.Option("--profiles-dir", help="Default: the configured DISPATCHER_PROFILES_DIR."),
    ] = None,
) -> None:
    """Run one prompt through a web profile and print each step as it happens.

    A screenshot per step goes to the folder; on failure, each selector of
    the profile that matches nothing is named with what the page shows
    nearest to it. Exit 0 when an answer came, 1 when it failed, 2 for bad
    input (an unknown model, an account the service holds).
    """
    from dispatcher.cli.tasks import _params
    from dispatcher.clock import SystemClock
    from dispatcher.errors import LockHeld
    from dispatcher.profiles import load_profiles
    from dispatcher.tasks.fingerprint import LocalFiles
    from webrunner.runner import WebRunner
    from webrunner.trial import try_profile

    settings = _load_settings(state_dir=options.get("state_dir"))
    params = _params(prompt, param or [])
    params.pop("prompt")
    with handled():
        profiles = load_profiles(profiles_dir or settings.profiles_dir)
        profile = profiles.get(model)
        if profile is None or profile.web is None:
            web = ", ".join(sorted(n for n, p in profiles.items() if p.web is not None))
            fail(f"no web model {model!r}; web models: {web or 'none'}", EXIT_USAGE)
        chosen = account or profile.accounts[0]
        if chosen not in profile.accounts:
            fail(f"{chosen!r} is no account of {model} ({', '.join(profile.accounts)})", EXIT_USAGE)
        folder = out or Path(f"try-{model}")
        files = LocalFiles.under(settings.resolved_input_dirs, settings.max_reference_image_bytes)
        clock = SystemClock()

        async def run() -> bool:
            runner = WebRunner(settings, {model: profile}, clock)
            try:
                await runner.start()
            except LockHeld as exc:
                fail(f"{exc}; stop the service (or try another account)", EXIT_USAGE)
            try:
                return await try_profile(
                    runner,
                    profile,
                    chosen,
                    prompt,
                    params,
                    clock=clock,
                    files=files,
                    out=folder,
                    say=lambda line: console.print(escape(line), soft_wrap=True),
                )
            finally:
                await runner.aclose()

        ok = asyncio.run(run())
    raise typer.Exit(EXIT_OK if ok else EXIT_FAILED)
