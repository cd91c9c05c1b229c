"""deploy/dispatcher.service: what it lets the service write, as systemd reads it."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "deploy" / "dispatcher.service"
SHARED_RESULTS = "/srv/dispatcher/results"


def _values(unit: str, key: str) -> list[str]:
    """Every word of every `key=` line (systemd's list settings add up)."""
    return [w for line in re.findall(rf"^{key}=(.*)$", unit, re.M) for w in line.split()]


def test_the_shared_results_dir_is_writable_under_protect_system_strict() -> None:
    unit = UNIT.read_text()
    assert _values(unit, "ProtectSystem") == ["strict"]
    writable = _values(unit, "ReadWritePaths")
    # No variables (systemd does not expand them here) and "-": a host
    # without a shared dir starts as before.
    assert writable == ["/var/lib/dispatcher", f"-{SHARED_RESULTS}"]
    # The path the operator is told to set is the one the unit opens.
    docs = (ROOT / "docs" / "operations.md").read_text()
    assert f"DISPATCHER_SHARED_RESULTS_DIR={SHARED_RESULTS}`" in docs


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
def test_systemd_accepts_the_unit(tmp_path: Path) -> None:
    # The checkout is not in /opt here: only the binary's path changes.
    unit = UNIT.read_text().replace("/opt/dispatcher/.venv/bin/python", sys.executable)
    (tmp_path / "dispatcher.service").write_text(unit)
    verified = subprocess.run(
        ["systemd-analyze", "verify", str(tmp_path / "dispatcher.service")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    said = verified.stdout + verified.stderr
    assert verified.returncode == 0, said
    assert "dispatcher.service" not in said, said  # not even a warning about it
