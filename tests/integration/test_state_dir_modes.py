"""The state dir holds prompts, results and errors: only its owner may read it."""

from __future__ import annotations

import os
import sqlite3
import stat
from pathlib import Path

import pytest

from dispatcher.errors import ConfigError
from dispatcher.service import Service
from dispatcher.settings import Settings
from tests.harness import profiles_dir, running_service


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


async def test_a_loose_state_dir_is_tightened_and_new_files_are_private(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    os.chmod(state, 0o755)
    (state / "results").mkdir(mode=0o755)
    os.chmod(state / "results", 0o755)
    # A database an older version left readable by everyone.
    sqlite3.connect(state / "dispatcher.db").close()
    os.chmod(state / "dispatcher.db", 0o644)
    old_umask = os.umask(0o022)
    try:
        async with running_service(tmp_path, state_dir=state) as h:
            assert _mode(state) == 0o700
            for name in ("results", "cache", "inputs"):
                assert _mode(state / name) == 0o700, name
            video = await h.submit("demo-video", "private clip", gen_s=1)
            done = await h.wait_task(video["id"])
            assert done["state"] == "success", done
            (file,) = done["result"]["files"]
            assert _mode(Path(file["path"])) & 0o077 == 0
            databases = [p for p in state.iterdir() if p.name.startswith("dispatcher.db")]
            assert {p.name for p in databases} >= {"dispatcher.db", "dispatcher.db-wal"}
            for db in databases:
                assert _mode(db) == 0o600, db.name
            for path in state.rglob("*"):
                assert _mode(path) & 0o077 == 0, path
        assert os.umask(0o022) == 0o022  # the test process gets its umask back
    finally:
        os.umask(old_umask)


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a dir to another uid needs root")
async def test_a_state_dir_owned_by_someone_else_is_refused(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    os.chown(state, 4242, -1)
    settings = Settings(
        state_dir=state,
        profiles_dir=profiles_dir(tmp_path, ["demo-chat-api"]),
        demo=True,
        time_scale=0.02,
    )
    with pytest.raises(ConfigError, match=f"owned by uid 4242.*{os.getuid()}"):
        await Service(settings).start()
    assert not (state / "dispatcher.db").exists()
