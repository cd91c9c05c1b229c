"""The state dir holds prompts, results and errors: only its owner may read it."""

from __future__ import annotations

import asyncio
import os
import shutil
import sqlite3
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

from demo.bootstrap import Demo
from dispatcher.errors import ConfigError
from dispatcher.service.core import Service
from dispatcher.settings import Settings
from tests.support.harness import profiles_dir, running_service


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
        await Service(settings, demo=Demo()).start()
    assert not (state / "dispatcher.db").exists()


NOBODY = 65534


def _open_state_dir() -> Path:
    """A state dir another user could write into (a parent they can traverse:
    pytest's tmp_path is 0700), as one left loose before the service first ran."""
    state = Path(tempfile.mkdtemp(prefix="dispatcher-loose-state-"))
    os.chmod(state, 0o777)
    return state


def _plant_link(target: Path, link: Path) -> None:
    """`ln -s target link`, run as nobody: what a local user could do to a loose dir."""
    subprocess.run(["ln", "-s", str(target), str(link)], user=NOBODY, check=True)
    assert link.lstat().st_uid == NOBODY


@pytest.mark.skipif(os.geteuid() != 0, reason="planting as another uid needs root")
async def test_token_and_port_are_not_written_through_planted_symlinks(tmp_path: Path) -> None:
    victims = {name: tmp_path / f"victim-{name}" for name in ("token.tmp", "port")}
    state = _open_state_dir()
    try:
        for name, victim in victims.items():
            victim.write_text("precious\n")
            os.chmod(victim, 0o644)
            _plant_link(victim, state / name)
        async with running_service(tmp_path, state_dir=state) as h:
            token = state / "token"
            port = state / "port"
            assert not token.is_symlink() and not port.is_symlink()
            assert token.read_text().strip() == h.service.credentials.token
            assert port.read_text().strip() == str(h.service.http.port)  # type: ignore[union-attr]
            assert _mode(token) == 0o600 and _mode(port) == 0o600
        for victim in victims.values():
            assert victim.read_text() == "precious\n", victim.name
            assert _mode(victim) == 0o644, victim.name
    finally:
        shutil.rmtree(state)


@pytest.mark.skipif(os.geteuid() != 0, reason="planting as another uid needs root")
@pytest.mark.parametrize("name", ["dispatcher.db", "dispatcher.db-wal", "service.lock"])
async def test_a_planted_database_or_lock_symlink_refuses_the_start(
    tmp_path: Path, name: str
) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    os.chmod(victim, 0o644)
    state = _open_state_dir()
    try:
        _plant_link(victim, state / name)
        settings = Settings(
            state_dir=state,
            profiles_dir=profiles_dir(tmp_path, ["demo-chat-api"]),
            demo=True,
            time_scale=0.02,
        )
        with pytest.raises(ConfigError, match=f"{name} is a symlink .*remove it"):
            await Service(settings, demo=Demo()).start()
        assert victim.read_text() == "precious\n"
        assert _mode(victim) == 0o644
    finally:
        shutil.rmtree(state)


@pytest.mark.skipif(os.geteuid() != 0, reason="planting as another uid needs root")
@pytest.mark.parametrize("name", ["cache", "inputs", "results"])
async def test_a_dir_link_planted_by_another_user_refuses_the_start(
    tmp_path: Path, name: str
) -> None:
    victim = tmp_path / "victim-dir"
    victim.mkdir()
    os.chmod(victim, 0o755)
    state = _open_state_dir()
    try:
        _plant_link(victim, state / name)
        settings = Settings(
            state_dir=state,
            profiles_dir=profiles_dir(tmp_path, ["demo-chat-api"]),
            demo=True,
            time_scale=0.02,
        )
        with pytest.raises(ConfigError, match=f"{name} is a symlink .*owned by uid {NOBODY}"):
            await Service(settings, demo=Demo()).start()
        assert _mode(victim) == 0o755
        assert list(victim.iterdir()) == []
    finally:
        shutil.rmtree(state)


def _locks_on(path: Path, pid: int) -> list[str]:
    """This process's POSIX locks on `path`, as /proc/locks lists them."""
    inode = f":{path.stat().st_ino} "
    return [
        line
        for line in Path("/proc/locks").read_text().splitlines()
        if " POSIX " in line and f" {pid} " in line and inode in line
    ]


async def test_the_service_keeps_its_database_locks_so_a_backup_cannot_crash_it(
    tmp_path: Path,
) -> None:
    """SQLite marks its shared-memory file as in use with a lock held for as
    long as the database is open. Once the service had opened it, it opened
    and closed the files again to tighten their modes, and a close drops
    every POSIX lock the process holds on the file: another process (the
    operator's `sqlite3 .backup`, a read-only look) then took the database
    for unused, re-initialised that file, and the service died of SIGBUS
    (seen as `demo-run` exiting -7 in the SIGTERM e2e under load)."""
    state = tmp_path / "state"
    async with running_service(tmp_path, state_dir=state) as h:
        await h.wait_task((await h.submit("demo-chat-api", "hello"))["id"])
        shm = state / "dispatcher.db-shm"
        assert _locks_on(shm, os.getpid()), "the service holds no lock on its -shm file"
        # Another process reading meanwhile leaves the service working.
        reader = await asyncio.create_subprocess_exec(
            "sqlite3",
            f"file:{state / 'dispatcher.db'}?mode=ro",
            "SELECT COUNT(*) FROM tasks",
            stdout=asyncio.subprocess.PIPE,
        )
        out, _ = await reader.communicate()
        assert reader.returncode == 0 and out.strip() == b"1"
        done = await h.wait_task((await h.submit("demo-chat-api", "again"))["id"])
        assert done["state"] == "success"
        assert _mode(state / "dispatcher.db") == 0o600
        assert _mode(shm) == 0o600
