"""One of this folder's gradio apps in a process of its own, serving on a
socket bound here and handed down (`common.serve_inherited`): the port is
ours from the choice to the app's start, so no other process can take it.

Used by the tests and by the benchmark (`bench/webpages.py`): gradio imports
in seconds, more on a busy machine, and must not share the tests' warnings
filter, hence the process and the generous wait for its first answer.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from dispatcher.service.serving import bind_loopback

REPO = Path(__file__).resolve().parents[2]
POLL_S = 0.2


class GradioProcess:
    """`python -m tests.gradio_apps.<module> <fd>`; its base URL is `url`."""

    def __init__(self, module: str) -> None:
        self.module = module
        sock = bind_loopback(None)
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        with sock:  # the app's copy serves
            self.popen = subprocess.Popen(
                [sys.executable, "-m", f"tests.gradio_apps.{module}", str(sock.fileno())],
                cwd=REPO,
                env={**os.environ, "PYTHONPATH": str(REPO)},
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                pass_fds=(sock.fileno(),),
            )

    def _still_starting(self, deadline: float) -> None:
        if self.popen.poll() is not None:
            raise RuntimeError(f"the gradio app {self.module} exited ({self.popen.returncode})")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the gradio app {self.module} did not start")

    async def until_serving(self, path: str, start_s: float) -> None:
        """Until `path` answers 200 (RuntimeError if the app exits or `start_s` passes)."""
        deadline = time.monotonic() + start_s
        async with httpx.AsyncClient() as client:
            while True:
                self._still_starting(deadline)
                try:
                    if (await client.get(self.url + path, timeout=10)).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                await asyncio.sleep(POLL_S)

    def until_serving_blocking(self, path: str, start_s: float) -> None:
        """`until_serving` for a caller with no event loop (a sync fixture)."""
        deadline = time.monotonic() + start_s
        with httpx.Client() as client:
            while True:
                self._still_starting(deadline)
                try:
                    if client.get(self.url + path, timeout=10).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                time.sleep(POLL_S)

    def stop(self) -> None:
        """SIGTERM, then a kill after 15 s: gone when this returns."""
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
