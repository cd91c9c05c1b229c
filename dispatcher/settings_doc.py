"""docs/settings.md, generated from the settings model (`dispatcher/settings.py`).

    python -m dispatcher.settings_doc > docs/settings.md

Every setting's row comes from its field: the variable from the name, the
default from the field (or its `shown_default` when the default is computed
on the machine), the meaning from its `description`, and whether a reload
applies it from `reload.LIVE_SETTINGS`. A test compares the committed file
with this output, so a setting added without regenerating fails the suite.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from pydantic.fields import FieldInfo

from dispatcher.service.reload import LIVE_SETTINGS
from dispatcher.settings import Settings

REGENERATE = "python -m dispatcher.settings_doc > docs/settings.md"

_INTRO = """\
# Settings

<!-- Generated from dispatcher/settings.py: do not edit by hand.
     Regenerate with `{regenerate}`. -->

Every setting is an environment variable `DISPATCHER_<NAME>`, or the same
variable in a `.env` file, or the setting's own name (lower case, no prefix)
in `dispatcher.toml`; both files are read from the service's working
directory (`/opt/dispatcher` under systemd). When several set one, the first
of these wins: a command-line option, the process environment (under
systemd: the unit's `Environment=` and `EnvironmentFile=` lines), `.env`,
`dispatcher.toml`. For example `dispatcher.toml`:

```toml
cache_ttl_s = 86400.0
concurrency = {{ openai = 3, fal = 2 }}
```

Under systemd the settings and API keys live in `/etc/dispatcher/dispatcher.env`,
a copy of `deploy/dispatcher.env.example`: only a line that *starts* with `#`
is a comment there, so never write a comment after a value
(docs/operations.md, "Install").

A bad value stops the start (exit 2) with one line per problem: the
variable, where it was set and its value (secrets masked).

Settings marked **live** are applied by a reload (`dispatcher reload`,
`systemctl reload dispatcher` or SIGHUP), the others at the next start; see
docs/operations.md, "Profiles and settings without a restart".

| setting | default | reload | meaning |
|---|---|---|---|
"""

_OUTRO = """
Profiles may reference `${NAME}` (environment variables); the demo profiles
use `${DEMO_API_URL}` / `${DEMO_WEB_URL}` / `${DEMO_COMFY_URL}`, which
`--demo` provides, and are skipped with a warning otherwise. Every profile
key: docs/profiles.md. `dispatcher check [DIR]` validates every profile of a
dir without a running service.
"""

_BYTE_UNITS = ((1024**3, "GiB"), (1024**2, "MiB"), (1024, "KiB"))
_SECOND_UNITS = ((86400, "days"), (3600, "h"), (60, "min"))


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _with_unit(value: float, units: tuple[tuple[int, str], ...]) -> str:
    for size, unit in units:
        if value >= size and value % size == 0:
            return f"`{_number(value)}` ({_number(value / size)} {unit})"
    return f"`{_number(value)}`"


def shown_default(name: str, field: FieldInfo) -> str:
    """The default as a reader wants it: never a value of the machine that generated the doc."""
    extra = field.json_schema_extra
    if isinstance(extra, dict) and "shown_default" in extra:
        return str(extra["shown_default"])
    if field.default_factory is not None:
        raise ValueError(f"setting {name!r} has a computed default and no `shown_default`")
    value: Any = field.default
    if value is None:
        return "none"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, int | float) and name.endswith("_bytes"):
        return _with_unit(value, _BYTE_UNITS)
    if isinstance(value, int | float) and name.endswith("_s"):
        return _with_unit(value, _SECOND_UNITS)
    if isinstance(value, int | float | str):
        return f"`{_number(value) if not isinstance(value, str) else value}`"
    raise ValueError(f"setting {name!r}: say its default with `shown_default`")


def render(fields: Mapping[str, FieldInfo] | None = None) -> str:
    """The whole of docs/settings.md; `fields` defaults to the settings model's."""
    rows = []
    for name, field in (Settings.model_fields if fields is None else fields).items():
        if not field.description:
            raise ValueError(f"setting {name!r} has no description (dispatcher/settings.py)")
        variable = f"`DISPATCHER_{name.upper()}`"
        reload = "live" if name in LIVE_SETTINGS else "restart"
        meaning = " ".join(field.description.split()).replace("|", "\\|")
        rows.append(f"| {variable} | {shown_default(name, field)} | {reload} | {meaning} |\n")
    return _INTRO.format(regenerate=REGENERATE) + "".join(rows) + _OUTRO


def main() -> None:
    sys.stdout.write(render())


if __name__ == "__main__":
    main()
