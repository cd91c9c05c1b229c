"""The CLI command our hints print is one that runs from where the operator stands."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from dispatcher.invocation import cli_command


def test_a_venv_python_off_path_is_named_relative_to_the_working_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    venv_python = tmp_path / "proj" / ".venv" / "bin" / "python"
    venv_python.parent.mkdir(parents=True)
    venv_python.symlink_to(sys.executable)
    monkeypatch.setattr(sys, "executable", str(venv_python))
    assert cli_command(cwd=tmp_path / "proj", path="/usr/bin") == ".venv/bin/python -m dispatcher"
    assert cli_command(cwd=tmp_path / "elsewhere", path="/usr/bin") == (
        f"{venv_python} -m dispatcher"
    )


def test_the_python_on_path_is_named_bare(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    python = bin_dir / "python3"
    python.symlink_to(sys.executable)
    monkeypatch.setattr(sys, "executable", str(python))
    assert cli_command(cwd=tmp_path, path=str(bin_dir)) == "python3 -m dispatcher"
