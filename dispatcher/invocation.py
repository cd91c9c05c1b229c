"""How an operator runs this CLI from where they stand, for hints we print.

A bare `python -m dispatcher` fails when the project lives in a venv that
is not on PATH (the README's `.venv/bin/python`): the hint names the
interpreter that is running now, as short as it can be typed.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path


def cli_command(*, cwd: Path | None = None, path: str | None = None) -> str:
    """The command line that starts this CLI, e.g. `.venv/bin/python -m dispatcher`."""
    # Not resolved: a venv's python is a symlink to the system one, and only
    # the unresolved path brings the venv's packages.
    executable = Path(os.path.abspath(sys.executable))
    search = os.environ.get("PATH", "") if path is None else path
    for name in (executable.name, "python3", "python"):
        found = shutil.which(name, path=search)
        if found and Path(os.path.abspath(found)) == executable:
            return f"{name} -m dispatcher"
    here = Path(os.path.abspath(cwd or Path.cwd()))
    try:
        shown = str(executable.relative_to(here))
    except ValueError:
        shown = str(executable)
    return f"{shown} -m dispatcher"
