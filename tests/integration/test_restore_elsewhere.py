"""A back-up restored into another state dir still serves every result file.

The database used to keep absolute paths: restored under a new path, every
file was "gone from disk" although it was there. It now keeps them relative
to the results dir. The back-up and restore follow docs/operations.md
(`sqlite3 .backup` while serving, `tar` of `results/`), into a new path.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.servicecli import start_service

pytestmark = pytest.mark.skipif(shutil.which("sqlite3") is None, reason="needs the sqlite3 CLI")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_back_up_move_restore_and_every_result_file_is_collected(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    first = start_service(tmp_path / "a")
    backup = tmp_path / "backup"
    backup.mkdir()
    try:
        batch = tmp_path / "shots.jsonl"
        batch.write_text(
            "".join(
                json.dumps({"model": "demo-video", "ref": f"shot-{n}", "prompt": f"shot {n}"})
                + "\n"
                for n in range(3)
            )
            + json.dumps({"model": "demo-chat-api", "ref": "line", "prompt": "a line"})
            + "\n"
        )
        done = first.cli("batch", str(batch), "--json")
        assert done.returncode == 0, done.stdout + done.stderr
        job_id = json.loads(done.stdout)["id"]
        before = first.cli("results", job_id, "--out", str(tmp_path / "before"), "--json")
        assert before.returncode == 0, before.stdout + before.stderr
        # The docs' recipe, online, while the service runs.
        state = first.state_dir
        subprocess.run(
            ["sqlite3", str(state / "dispatcher.db"), f".backup {backup / 'dispatcher.db'}"],
            check=True,
            timeout=60,
        )
        subprocess.run(
            ["tar", "-C", str(state), "-czf", str(backup / "results.tgz"), "results"],
            check=True,
            timeout=60,
        )
    finally:
        first.stop()
    shutil.rmtree(tmp_path / "a")  # the old machine's paths are gone

    new_state = tmp_path / "b" / "state"
    new_state.mkdir(parents=True, mode=0o700)
    shutil.copy(backup / "dispatcher.db", new_state / "dispatcher.db")
    subprocess.run(
        ["tar", "-C", str(new_state), "-xzf", str(backup / "results.tgz")], check=True, timeout=60
    )
    second = start_service(tmp_path / "b")
    try:
        assert second.state_dir == new_state
        out = tmp_path / "after"
        collected = second.cli("results", job_id, "--out", str(out), "--json")
        assert collected.returncode == 0, collected.stdout + collected.stderr
        answer = json.loads(collected.stdout)
        assert answer["complete"] and answer["written"] == 4
        for name in ("shot-0", "shot-1", "shot-2"):
            (made,) = out.glob(f"{name}.*")
            (was,) = (tmp_path / "before").glob(f"{name}.*")
            assert _sha256(made) == _sha256(was)
        assert (out / "line.txt").read_text() == (tmp_path / "before" / "line.txt").read_text()

        job = json.loads(second.cli("status", job_id, "--json").stdout)
        video = next(t for t in job["tasks"] if t["ref"] == "shot-0")
        shown = json.loads(second.cli("status", video["id"], "--json").stdout)
        (meta,) = shown["result"]["files"]
        real = Path(meta["path"])
        assert real.is_relative_to(new_state / "results") and real.is_file()
        assert _sha256(real) == meta["sha256"]
        text = second.cli("status", video["id"])
        assert text.returncode == 0 and str(real) in "".join(text.stdout.split())
    finally:
        second.stop()
