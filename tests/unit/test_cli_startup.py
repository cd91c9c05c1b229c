"""Every CLI command starts by importing `dispatcher.cli`: what it pulls in
is paid on each `dispatcher status` an operator types (and each CLI call a
script makes). Building the profile and settings models took ~0.25 s of
it; the commands that read them import them when they run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Imported by the commands that need them, never by the CLI's start.
DEFERRED = ("dispatcher.profiles", "dispatcher.settings", "pydantic_settings")


def test_the_cli_starts_without_building_the_profile_and_settings_models() -> None:
    probe = (
        "import json, sys; import dispatcher.cli; "
        f"print(json.dumps([m for m in {list(DEFERRED)!r} if m in sys.modules]))"
    )
    # A process of its own: this one has imported them already.
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert json.loads(out.stdout) == []
