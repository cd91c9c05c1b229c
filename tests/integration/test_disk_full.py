"""A full results disk: the task fails with a clear error, nothing else breaks.

A small tmpfs is mounted on the state dir's `results` (the database stays on
the test's own disk, as the store keeps writing) and filled to the last
byte. Mounting needs root (as in CI); elsewhere the test is skipped and
says why.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from demo.api_provider import video_bytes
from tests.support.harness import running_service

SCALE = 0.02


@contextlib.contextmanager
def small_disk(path: Path, size: str = "256k") -> Iterator[None]:
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        pytest.skip("mounting a tmpfs for the full-disk test needs root")
    path.mkdir(parents=True, mode=0o700)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs on {path}: {mounted.stderr.strip()}")
    try:
        yield
    finally:
        if subprocess.run(["umount", str(path)], check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], check=False)


def fill(path: Path) -> Path:
    """Take every free byte of the file system under `path`."""
    filler = path / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        with contextlib.suppress(OSError):
            while True:
                os.write(fd, b"\0" * 4096)
    finally:
        os.close(fd)
    assert os.statvfs(path).f_bavail == 0
    return filler


async def test_a_full_results_disk_fails_the_task_clearly_and_the_service_carries_on(
    tmp_path: Path,
) -> None:
    state_dir = tmp_path / "state"
    results = state_dir / "results"
    with small_disk(results):
        filler = fill(results)
        async with running_service(tmp_path, time_scale=SCALE, state_dir=state_dir) as h:
            video = await h.submit("demo-video", "nowhere to put it", gen_s=2)
            chat = await h.submit("demo-chat-api", "text needs no file")
            failed = await h.wait_task(video["id"])
            assert failed["state"] == "failed"
            assert failed["attempt"] == 1  # not generated (and paid for) again
            assert failed["error"]["kind"] == "disk_full"
            message = failed["error"]["message"]
            assert "the results disk is full" in message
            assert str(results) in message and "No space left on device" in message
            assert (await h.demo_stats())["jobs_created"] == 1
            # A text answer needs no results disk: the service keeps serving.
            assert (await h.wait_task(chat["id"]))["state"] == "success"
            listing = await h.http.get("/v1/tasks", params={"state": "failed"})
            assert listing.status_code == 200
            assert [t["id"] for t in listing.json()["items"]] == [video["id"]]
            assert not [p for p in results.rglob("*") if p.name.endswith(".part")]

            # Space is back: the next task succeeds, and so does a retry.
            filler.unlink()
            nxt = await h.submit("demo-video", "room again", gen_s=2)
            done = await h.wait_task(nxt["id"])
            assert done["state"] == "success"
            [file] = done["result"]["files"]
            assert Path(file["path"]).read_bytes() == video_bytes("room again")
            retried = await h.http.post(f"/v1/tasks/{video['id']}/retry")
            assert retried.status_code == 200, retried.text
            assert (await h.wait_task(video["id"]))["state"] == "success"
            assert (await h.demo_stats())["jobs_created"] == 3
        # The store was never the worse for it.
        with contextlib.closing(sqlite3.connect(state_dir / "dispatcher.db")) as db:
            assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
            states = dict(db.execute("SELECT state, COUNT(*) FROM tasks GROUP BY state"))
        assert states == {"success": 3}
