"""`make demo` (`python -m dispatcher demo-run`), reloaded with SIGHUP and stopped
with SIGTERM in the middle of its batch as a service manager or `kill` stops it: a clean exit,
nothing left running, every task recoverable."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.support.helpers import REPO

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(120)]


def _states(db: Path) -> dict[str, int]:
    if not db.exists():
        return {}
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
            rows = conn.execute("SELECT state, COUNT(*) FROM tasks GROUP BY state").fetchall()
    except sqlite3.OperationalError:  # the file is there, its schema not yet
        return {}
    return dict(rows)


def test_sigterm_mid_batch_stops_the_demo_cleanly(tmp_path: Path) -> None:
    state = tmp_path / "state"
    log_path = tmp_path / "demo.log"
    env = {**os.environ, "DISPATCHER_STATE_DIR": str(state), "COLUMNS": "100"}
    with log_path.open("w") as log:
        demo = subprocess.Popen(
            [sys.executable, "-m", "dispatcher", "demo-run"],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    tree: list[psutil.Process] = []
    alive: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 60
        # Stopped while tasks run: some done, some still running or waiting.
        while time.monotonic() < deadline and demo.poll() is None:
            counts = _states(state / "dispatcher.db")
            if counts.get("success", 0) >= 2 and counts.get("running", 0) >= 1:
                break
            time.sleep(0.05)
        assert demo.poll() is None, log_path.read_text()
        # A hang-up reloads, as the README says of SIGHUP; the batch goes on.
        done_before = _states(state / "dispatcher.db").get("success", 0)
        demo.send_signal(signal.SIGHUP)
        while time.monotonic() < deadline and demo.poll() is None:
            if _states(state / "dispatcher.db").get("success", 0) > done_before:
                break
            time.sleep(0.05)
        assert demo.poll() is None, f"SIGHUP ended the demo: {log_path.read_text()[-2000:]}"
        tree = psutil.Process(demo.pid).children(recursive=True)
        assert any("chromium" in p.name() for p in tree), "the demo's web lane runs no browser"
        demo.terminate()
        code = demo.wait(timeout=30)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
        # Its browsers and demo backends end with it (a browser closes within
        # the 3 s grace); whatever outlives that is a leak, reaped here.
        _, alive = psutil.wait_procs(tree, timeout=10)
        for proc in alive:
            proc.kill()
    assert code == 0, log_path.read_text()[-3000:]
    assert not alive, [p.name() for p in alive]
    assert not (state / "port").exists()
    assert "stopping" in log_path.read_text()
    # Nothing lost: what did not finish is pending or running (resumed at the next start).
    counts = _states(state / "dispatcher.db")
    assert set(counts) <= {"success", "pending", "running"}, counts
    assert sum(counts.values()) == 14 and counts["success"] < 14, counts
