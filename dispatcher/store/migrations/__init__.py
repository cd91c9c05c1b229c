"""Schema migrations as SQL files, one directory per dialect.

`sqlite/NNNN_name.sql` and `postgresql/NNNN_name.sql` are applied in the
order of their number, each in one transaction with its row in
`schema_version`, and never edited once shipped. The two dialects number
their files on their own: PostgreSQL started with the schema SQLite had
reached by its version 6.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources

DIALECTS = ("sqlite", "postgresql")
_FILE = re.compile(r"(\d{4})_([a-z0-9_]+)\.sql")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    statements: tuple[str, ...]


def split_statements(text: str) -> list[str]:
    """The statements of a migration file: `--` comment lines dropped, split
    at a `;` that ends a line (no statement here holds one inside a string)."""
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("--")]
    parts = re.split(r";[ \t]*(?:\n|$)", "\n".join(lines))
    return [part.strip() for part in parts if part.strip()]


@cache
def migrations(dialect: str) -> tuple[Migration, ...]:
    if dialect not in DIALECTS:
        raise ValueError(f"no migrations for dialect {dialect!r}")
    found = []
    for entry in resources.files(__name__).joinpath(dialect).iterdir():
        match = _FILE.fullmatch(entry.name)
        if match is None:
            continue
        found.append(
            Migration(
                version=int(match[1]),
                name=match[2],
                statements=tuple(split_statements(entry.read_text(encoding="utf-8"))),
            )
        )
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):
        raise RuntimeError(f"{dialect} migrations are not numbered 1..n: {versions}")
    return tuple(found)


def latest_version(dialect: str) -> int:
    return migrations(dialect)[-1].version
