"""DISPATCHER_INPUT_DIRS: a ":"-separated list, defaulting to <state dir>/inputs."""

from __future__ import annotations

from pathlib import Path

import pytest

from dispatcher.settings import Settings


def test_input_dirs_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DISPATCHER_INPUT_DIRS", f"{tmp_path}/a::{tmp_path}/b")
    monkeypatch.setenv("DISPATCHER_MAX_REFERENCE_IMAGE_BYTES", "1000")
    settings = Settings(state_dir=tmp_path / "state")
    assert settings.resolved_input_dirs == [tmp_path / "a", tmp_path / "b"]
    assert settings.max_reference_image_bytes == 1000


def test_default_input_dir_is_in_the_state_dir(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("DISPATCHER_INPUT_DIRS", raising=False)
    assert Settings(state_dir=tmp_path).resolved_input_dirs == [tmp_path / "inputs"]
