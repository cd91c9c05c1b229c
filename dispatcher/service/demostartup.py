"""The demo's start-up step, as the service sees it.

The bundled demo (`demo/`: a fake API vendor, a web model, a ComfyUI) is
not part of the service: the CLI passes its start-up step in
(`Service(settings, demo=Demo())`, `demo.bootstrap.Demo`), so the service
runs without the demo package and never imports it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

from dispatcher.errors import ConfigError
from dispatcher.service.serving import RunningServer
from dispatcher.settings import Settings

if TYPE_CHECKING:
    from webrunner.runner import WebRunner


class DemoStartup(Protocol):
    async def start_servers(
        self, servers: list[RunningServer], settings: Settings
    ) -> dict[str, str]:
        """Start the demo's servers (at the settings' time scale; the sample
        inputs go to their input dirs), each appended to `servers` as it comes
        up (a start that fails halfway stops those before it); their URLs by
        the variable the demo profiles name them with (DEMO_API_URL, ...)."""
        ...

    async def log_in(self, web: WebRunner, urls: Mapping[str, str]) -> None:
        """Log the demo's web accounts in to the demo site, once the web runner
        has started (a real site's profile comes with its login)."""
        ...


async def start_demo(
    demo: DemoStartup | None,
    servers: list[RunningServer],
    stack: contextlib.AsyncExitStack,
    settings: Settings,
) -> dict[str, str]:
    """The demo's servers started, each listed in `servers` and stopped by
    `stack`; their URLs. ConfigError when the settings ask for the demo and
    whoever made the service did not pass its start-up step in."""
    if demo is None:
        raise ConfigError(
            "the demo is on (DISPATCHER_DEMO) but this service was made without "
            "the demo's start-up step: start it with `dispatcher serve --demo`"
        )
    # Pushed first: the demo lists each server as it comes up, so one
    # failing stops those before it.
    stack.push_async_callback(_stop_all, servers)
    return await demo.start_servers(servers, settings)


async def _stop_all(servers: list[RunningServer]) -> None:
    # Side by side: each uvicorn stop waits out its own ticks (up to 0.1 s
    # to notice, 0.1 s after closing its connections), so one after the
    # other the demo's three servers added ~0.5 s to every stop.
    running = list(servers)
    servers.clear()
    # Each stop runs to its end before a failure of another is raised: one
    # left running would hold its socket past the loop's close.
    results = await asyncio.gather(*(server.stop() for server in running), return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
