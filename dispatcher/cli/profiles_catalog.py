"""`dispatcher profiles list` and `profiles add`: the bundled vendor catalog.

The catalog (`profiles/vendors/`, beside the bundled demo profiles) holds
ready profiles for real vendors' APIs. Nothing loads them until one is
copied into the profiles dir: `list` shows what is there and which are in
use, `add` copies one and names the variables it needs. Neither needs a
running service; `dispatcher check` then validates the dir, and
`dispatcher reload` (or a restart) serves the new model.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Table

from dispatcher.cli.output import JsonFlag, console, err, fitted, print_json
from dispatcher.cli.plumbing import EXIT_USAGE, fail, load_settings, options
from dispatcher.errors import ConfigError

if TYPE_CHECKING:
    from dispatcher.profiles import Profile

# The bundled catalog, beside the bundled demo profiles (settings'
# BUNDLED_PROFILES_DIR, named here without importing the settings: every
# command of the CLI imports this module, most never read a profile).
CATALOG_DIR = Path(__file__).resolve().parent.parent.parent / "profiles" / "vendors"
# What a narrow terminal leaves out first (ranks as in output.fitted).
LIST_COLUMNS = (
    ("NAME", 0),
    ("VENDOR", 0),
    ("KIND", 2),
    ("STYLE", 1),
    ("KEY ENV", 0),
    ("LOADED", 0),
)

profiles_app = typer.Typer(
    no_args_is_help=True,
    rich_markup_mode=None,
    help="Model profiles: the vendor catalog, ready profiles for real APIs (list, add), "
    "and one prompt through a web profile, step by step (try).",
)

CatalogOption = Annotated[
    Path | None,
    typer.Option("--catalog", help="A catalog dir (default: the bundled profiles/vendors)."),
]


@dataclass(frozen=True)
class Entry:
    name: str
    vendor: str
    kind: str
    style: str
    keys: tuple[str, ...]  # the variables holding the key (and secret)
    settings: tuple[str, ...]  # other variables it reads (a base URL, with a default)
    file: Path
    state: str  # "loaded", "invalid", "skipped" or "-" (not in the profiles dir)

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "vendor": self.vendor,
            "kind": self.kind,
            "style": self.style,
            "env": list(self.keys),
            "optional_env": list(self.settings),
            "file": str(self.file),
            "state": self.state,
        }


def _keys(profile: Profile) -> tuple[str, ...]:
    api = profile.api
    if api is None:
        return ()
    return tuple(name for name in (api.auth_env, api.auth_secret_env) if name)


def catalog(catalog_dir: Path, profiles_dir: Path) -> list[Entry]:
    """Every catalog profile, and whether the profiles dir serves it."""
    # Imported here: building the profile models costs ~0.1 s of every CLI
    # call's start, and only `profiles list|add` read them.
    from dispatcher.profiles import read_profiles, referenced_variables

    found = read_profiles(catalog_dir)
    if found.problems:
        raise ConfigError(f"the catalog is broken: {found.problems[0]}")
    try:
        used = read_profiles(profiles_dir)
    except ConfigError:
        used = None
    invalid = used.invalid_models() if used is not None else {}
    entries = []
    for name, profile in sorted(found.profiles.items()):
        if used is not None and name in used.profiles:
            state = "loaded"
        elif name in invalid:
            state = "skipped" if "skipped" in invalid[name] else "invalid"
        else:
            state = "-"
        file = Path(profile.source)
        entries.append(
            Entry(
                name=name,
                vendor=", ".join(profile.provider_names),
                kind=profile.kind.value,
                style=profile.api.style if profile.api is not None else "web",
                keys=_keys(profile),
                settings=tuple(sorted(referenced_variables(file))),
                file=file,
                state=state,
            )
        )
    return entries


def _where(catalog_dir: Path | None) -> tuple[Path, Path]:
    settings = load_settings(state_dir=options.get("state_dir"))
    return catalog_dir or CATALOG_DIR, settings.profiles_dir


@profiles_app.command("list")
def list_profiles(catalog_dir: CatalogOption = None, as_json: JsonFlag = False) -> None:
    """The catalog: name, vendor, kind, the key's variable, and whether it is loaded."""
    where, profiles_dir = _where(catalog_dir)
    try:
        entries = catalog(where, profiles_dir)
    except ConfigError as exc:
        fail(str(exc), EXIT_USAGE, "config")
    if as_json:
        print_json({"profiles_dir": str(profiles_dir), "catalog": [e.to_json() for e in entries]})
        return
    columns = fitted(LIST_COLUMNS, console.width)
    # Plain columns (a name starts its line, for grep); the keys wrap rather
    # than push LOADED past a narrow terminal's edge.
    table = Table(box=None, pad_edge=False, show_edge=False, header_style="")
    for column, _ in columns:
        table.add_column(column, no_wrap=column == "NAME", overflow="fold")
    for e in entries:
        keys = " + ".join(e.keys) or "-"
        set_mark = "" if all(os.environ.get(k) for k in e.keys) else " (unset)"
        cells = {
            "NAME": escape(e.name),
            "VENDOR": escape(e.vendor),
            "KIND": e.kind,
            "STYLE": e.style,
            "KEY ENV": escape(keys + set_mark),
            "LOADED": e.state,
        }
        table.add_row(*(cells[column] for column, _ in columns))
    console.print(table)
    console.print(
        f"profiles dir: {escape(str(profiles_dir))}; add one: dispatcher profiles add NAME"
    )


@profiles_app.command("add")
def add_profile(
    name: Annotated[str, typer.Argument(help="A catalog profile's name (see `profiles list`).")],
    force: Annotated[bool, typer.Option("--force", help="Replace a file of that name.")] = False,
    catalog_dir: CatalogOption = None,
) -> None:
    """Copy a catalog profile into the profiles dir and say which variables to set."""
    where, profiles_dir = _where(catalog_dir)
    try:
        entries = {e.name: e for e in catalog(where, profiles_dir)}
    except ConfigError as exc:
        fail(str(exc), EXIT_USAGE, "config")
    entry = entries.get(name)
    if entry is None:
        close = [n for n in entries if name.split("-")[0] in n] or sorted(entries)
        fail(f"no catalog profile {name!r}; try one of: {', '.join(close)}", EXIT_USAGE)
    if not profiles_dir.is_dir():
        fail(f"profiles dir {profiles_dir} does not exist", EXIT_USAGE)
    target = profiles_dir / entry.file.name
    if target.exists() and not force:
        fail(f"{target} exists already (--force replaces it)", EXIT_USAGE)
    shutil.copyfile(entry.file, target)
    console.print(f"added {escape(name)} as {escape(str(target))}")
    for key in entry.keys:
        state = "set" if os.environ.get(key) else "NOT set"
        console.print(f"  key: {key} ({state} here); set it in the service's environment")
    for variable in entry.settings:
        console.print(f"  optional: {variable} (the vendor's base URL by default)")
    err.print("then: dispatcher check, and dispatcher reload (or restart) to serve it")
