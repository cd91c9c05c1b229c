"""Real processes for end-to-end tests: the service and a demo vendor that outlives it."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from dispatcher.cli.service_client import wait_until_serving
from tests.support.helpers import REPO


@dataclass
class Proc:
    popen: subprocess.Popen[str]
    log_path: Path
    # What a SIGKILL left running: the service's browsers outlive it, as they
    # would in production until its next start reaps them.
    left_behind: list[psutil.Process] = field(default_factory=list)

    def kill9(self) -> None:
        with contextlib.suppress(psutil.Error):
            self.left_behind = psutil.Process(self.popen.pid).children(recursive=True)
        self.popen.send_signal(signal.SIGKILL)
        self.popen.wait(timeout=10)

    def reap_left_behind(self) -> None:
        """Kill what `kill9` left running, for a test whose killed host never starts again."""
        for child in self.left_behind:
            with contextlib.suppress(psutil.Error):
                child.kill()
        psutil.wait_procs(self.left_behind, timeout=10)

    def terminate(self, timeout_s: float = 30.0) -> int:
        self.popen.send_signal(signal.SIGTERM)
        return self.popen.wait(timeout=timeout_s)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def start_demo_api(
    tmp_path: Path, time_scale: float, quota: int = 3
) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "demo",
            "api",
            "--time-scale",
            str(time_scale),
            "--quota",
            str(quota),
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    url = proc.stdout.readline().strip()
    assert url.startswith("http://127.0.0.1:"), url
    return proc, url


def vendor_and_env(
    tmp_path: Path, profile_names: tuple[str, ...], time_scale: float
) -> tuple[subprocess.Popen[str], str, dict[str, str]]:
    """A demo vendor in its own process, and the environment for a service using it."""
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    for name in profile_names:
        shutil.copy(REPO / "profiles" / f"{name}.toml", profiles)
    vendor, vendor_url = start_demo_api(tmp_path, time_scale)
    env = {
        "DISPATCHER_PROFILES_DIR": str(profiles),
        "DISPATCHER_TIME_SCALE": str(time_scale),
        "DEMO_API_URL": vendor_url,
        "DEMO_API_KEY": "e2e-" + os.urandom(6).hex(),
    }
    return vendor, vendor_url, env


def stop_proc(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


# A start is given up once its process tree has used no CPU for this long (a
# busy machine makes a start slow, not idle: at load 46 on 2 cores a host with
# browsers took past a fixed 60 s), or after START_CAP_S in all.
START_IDLE_S = 60.0
START_CAP_S = 600.0


def _cpu_s(pid: int) -> float:
    """CPU seconds used by a process and its children so far (0 once it is gone)."""
    with contextlib.suppress(psutil.Error):
        root = psutil.Process(pid)
        total = 0.0
        for one in (root, *root.children(recursive=True)):
            with contextlib.suppress(psutil.Error):
                times = one.cpu_times()
                total += times.user + times.system
        return total
    return 0.0


def _until_serving(state_dir: Path, popen: subprocess.Popen[str]) -> bool:
    started = moved_at = time.monotonic()
    used = _cpu_s(popen.pid)
    while time.monotonic() - started < START_CAP_S:
        if wait_until_serving(state_dir, alive=lambda: popen.poll() is None, timeout_s=5):
            return True
        if popen.poll() is not None:
            return False
        now_used = _cpu_s(popen.pid)
        if now_used > used:
            used, moved_at = now_used, time.monotonic()
        elif time.monotonic() - moved_at > START_IDLE_S:
            return False
    return False


def start_service(
    state_dir: Path, env: Mapping[str, str], log_path: Path, args: tuple[str, ...] = ()
) -> Proc:
    """Start `python -m dispatcher` and return once it answers with a fresh token."""
    (state_dir / "port").unlink(missing_ok=True)
    (state_dir / "token").unlink(missing_ok=True)
    full_env = {**os.environ, "DISPATCHER_STATE_DIR": str(state_dir), **env}
    handle = log_path.open("a")
    popen = subprocess.Popen(
        [sys.executable, "-m", "dispatcher", *args],
        cwd=REPO,
        env=full_env,
        stdout=handle,
        stderr=subprocess.STDOUT,
        text=True,
    )
    handle.close()
    proc = Proc(popen, log_path)
    if _until_serving(state_dir, popen):
        return proc
    if popen.poll() is not None:
        raise AssertionError(f"service exited with {popen.returncode}:\n{proc.log()[-3000:]}")
    popen.kill()
    popen.wait()
    raise AssertionError(f"service did not come up:\n{proc.log()[-3000:]}")


def service_client(state_dir: Path) -> httpx.Client:
    port = (state_dir / "port").read_text().strip()
    token = (state_dir / "token").read_text().strip()
    return httpx.Client(
        base_url=f"http://127.0.0.1:{port}",
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,  # a busy 2-core machine starting browsers can take seconds to answer
    )


def demo_stats(url: str) -> dict[str, Any]:
    return dict(httpx.get(f"{url}/__stats", timeout=5).json())
