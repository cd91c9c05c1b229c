"""`dispatcher profiles list` and `profiles add`, as a new user runs them:
list the catalog, add one, see which key to set, and `check` loads it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.support.helpers import REPO
from tests.support.servicecli import clean_env, run_cli


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = clean_env(
        {
            "DISPATCHER_PROFILES_DIR": str(tmp_path / "profiles"),
            "DISPATCHER_STATE_DIR": str(tmp_path / "state"),
            **extra,
        }
    )
    for name in ("OPENAI_API_KEY", "KLING_ACCESS_KEY", "KLING_SECRET_KEY"):
        env.pop(name, None)
    return env


def _cli(tmp_path: Path, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return run_cli(args, _env(tmp_path, **extra), REPO)


def test_list_add_check(tmp_path: Path) -> None:
    (tmp_path / "profiles").mkdir()
    listed = _cli(tmp_path, "profiles", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    catalog = {e["name"]: e for e in json.loads(listed.stdout)["catalog"]}
    assert len(catalog) >= 10
    assert len({e["vendor"] for e in catalog.values()}) >= 8
    assert catalog["openai-sora-2"]["env"] == ["OPENAI_API_KEY"]
    assert catalog["kling-v2-1"]["env"] == ["KLING_ACCESS_KEY", "KLING_SECRET_KEY"]
    assert catalog["openai-sora-2"]["state"] == "-"

    added = _cli(tmp_path, "profiles", "add", "openai-sora-2")
    assert added.returncode == 0, added.stderr
    assert "OPENAI_API_KEY (NOT set here)" in added.stdout
    assert "OPENAI_BASE_URL" in added.stdout
    assert (tmp_path / "profiles" / "openai-sora-2.toml").read_bytes() == (
        REPO / "profiles" / "vendors" / "openai-sora-2.toml"
    ).read_bytes()

    again = _cli(tmp_path, "profiles", "add", "openai-sora-2")
    assert again.returncode == 2 and "exists already" in again.stderr
    unknown = _cli(tmp_path, "profiles", "add", "sora")
    assert unknown.returncode == 2 and "openai-sora-2" in unknown.stderr

    checked = _cli(tmp_path, "check", OPENAI_API_KEY="sk-test-123456")
    assert checked.returncode == 0, checked.stderr
    assert "ok       openai-sora-2" in checked.stdout
    table = _cli(tmp_path, "profiles", "list")
    row = next(line for line in table.stdout.splitlines() if line.startswith("openai-sora-2 "))
    assert row.split()[-1] == "loaded"


def test_the_list_reads_at_80_columns(tmp_path: Path) -> None:
    # Each profile's line ends with whether it is loaded; a line past the
    # terminal's edge put that on a line of its own.
    (tmp_path / "profiles").mkdir()
    listed = _cli(tmp_path, "profiles", "list", "--json")
    states = {e["name"]: e["state"] for e in json.loads(listed.stdout)["catalog"]}
    table = _cli(tmp_path, "profiles", "list", COLUMNS="80").stdout
    lines = table.splitlines()
    assert all(len(line) <= 80 for line in lines), table
    rows = {line.split()[0]: line.split() for line in lines if line and line.split()[0] in states}
    assert rows.keys() == states.keys(), table
    assert all(rows[name][-1] == state for name, state in states.items()), table
    assert rows["kling-v2-1"][2:5] == ["KLING_ACCESS_KEY", "+", "KLING_SECRET_KEY"], table
