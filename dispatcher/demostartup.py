"""The demo's start-up step, as the service sees it.

The bundled demo (`demo/`: a fake API vendor, a web model, a ComfyUI) is
not part of the service: the CLI passes its start-up step in
(`Service(settings, demo=Demo())`, `demo.bootstrap.Demo`), so the service
runs without the demo package and never imports it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from dispatcher.serving import RunningServer

if TYPE_CHECKING:
    from webrunner.runner import WebRunner


class DemoStartup(Protocol):
    async def start_servers(
        self,
        servers: list[RunningServer],
        *,
        time_scale: float,
        state_dir: Path,
        input_dirs: list[Path],
    ) -> dict[str, str]:
        """Start the demo's servers, each appended to `servers` as it comes up
        (a start that fails halfway stops those before it); their URLs by the
        variable the demo profiles name them with (DEMO_API_URL, ...)."""
        ...

    async def log_in(self, web: WebRunner, urls: Mapping[str, str]) -> None:
        """Log the demo's web accounts in to the demo site, once the web runner
        has started (a real site's profile comes with its login)."""
        ...
