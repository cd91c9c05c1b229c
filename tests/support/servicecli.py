"""`python -m dispatcher` as real processes: the service, and CLI commands against it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx

from dispatcher.cli.service_client import wait_until_serving
from tests.support.harness import API_PROFILES, profiles_dir

DEMO_API_KEY = "demo-key-for-tests-7f3a9c2e51"
TIME_SCALE = "0.02"


def clean_env(extra: Mapping[str, str]) -> dict[str, str]:
    """The caller's environment without any DISPATCHER_* of its own, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISPATCHER_")}
    env.pop("DEMO_API_KEY", None)
    env.update({"COLUMNS": "200", "NO_COLOR": "1", "PYTHONUNBUFFERED": "1"})
    env.update(extra)
    return env


def run_cli(
    args: Iterable[str], env: Mapping[str, str], cwd: Path, timeout_s: float = 90.0
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dispatcher", *args],
        env=dict(env),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def run_many(
    commands: Iterable[Iterable[str]], env: Mapping[str, str], cwd: Path, timeout_s: float = 90.0
) -> list[subprocess.CompletedProcess[str]]:
    """Several CLI commands at once (they are independent); results in order."""
    started = [
        (
            list(args),
            subprocess.Popen(
                [sys.executable, "-m", "dispatcher", *args],
                env=dict(env),
                cwd=cwd,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            ),
        )
        for args in commands
    ]
    results = []
    for args, popen in started:
        try:
            out, err = popen.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            popen.kill()
            out, err = popen.communicate()
        results.append(subprocess.CompletedProcess(args, popen.returncode, out, err))
    return results


@dataclass
class ServiceProcess:
    popen: subprocess.Popen[str]
    state_dir: Path
    log_path: Path
    env: dict[str, str]
    cwd: Path

    @property
    def token(self) -> str:
        return (self.state_dir / "token").read_text().strip()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{(self.state_dir / 'port').read_text().strip()}"

    def cli(self, *args: str, timeout_s: float = 90.0) -> subprocess.CompletedProcess[str]:
        return run_cli(args, self.env, self.cwd, timeout_s)

    def cli_many(
        self, *commands: Iterable[str], timeout_s: float = 90.0
    ) -> list[subprocess.CompletedProcess[str]]:
        return run_many(commands, self.env, self.cwd, timeout_s)

    def http(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=10
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM, then the exit code (killed and -9 if it hangs)."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        return self.popen.returncode


def start_service(
    tmp_path: Path,
    *,
    args: Iterable[str] = ("--demo",),
    profiles: Iterable[str] = API_PROFILES,
    env: Mapping[str, str] | None = None,
) -> ServiceProcess:
    """Start the service with the demo backends; return once it answers."""
    state_dir = tmp_path / "state"
    full_env = clean_env(
        {
            "DISPATCHER_STATE_DIR": str(state_dir),
            "DISPATCHER_PROFILES_DIR": str(profiles_dir(tmp_path, profiles)),
            "DISPATCHER_TIME_SCALE": TIME_SCALE,
            "DEMO_API_KEY": DEMO_API_KEY,
            **(env or {}),
        }
    )
    log_path = tmp_path / "service.log"
    with log_path.open("w") as handle:
        popen = subprocess.Popen(
            [sys.executable, "-m", "dispatcher", *args],
            env=full_env,
            cwd=tmp_path,
            stdout=handle,
            stderr=subprocess.STDOUT,
            text=True,
        )
    service = ServiceProcess(popen, state_dir, log_path, full_env, tmp_path)
    if wait_until_serving(state_dir, alive=lambda: popen.poll() is None, timeout_s=90):
        return service
    if popen.poll() is not None:
        raise AssertionError(f"service exited with {popen.returncode}:\n{service.log()[-3000:]}")
    service.stop()
    raise AssertionError(f"service did not come up:\n{service.log()[-3000:]}")
