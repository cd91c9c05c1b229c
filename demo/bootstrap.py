"""What `--demo` adds to a starting service: the three demo servers, a demo
API key, the sample batch's reference images and the demo accounts' logins.

The CLI hands them to the service as `Demo` (`dispatcher.service.demostartup.DemoStartup`),
so the service keeps nothing demo-specific of its own and never imports this
package; the bundled profiles read the URLs written here (see
`dispatcher/cli/server.py`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from demo import INPUTS_DIR
from demo.api_provider import start_demo_api
from demo.comfyui import start_demo_comfy
from demo.web_model import login_demo_accounts, start_demo_web
from dispatcher.logs import redact
from dispatcher.service.serving import RunningServer
from dispatcher.settings import Settings

if TYPE_CHECKING:
    from webrunner.runner import WebRunner

log = logging.getLogger("dispatcher.service")

DEMO_FILE = "demo.json"
DEMO_API_KEY_ENV = "DEMO_API_KEY"


async def start_demos(
    servers: list[RunningServer], *, time_scale: float, state_dir: Path, input_dirs: list[Path]
) -> dict[str, str]:
    """Start the demo servers (each appended to `servers` as it comes up, so a
    failed start still stops the ones before it); their URLs by variable."""
    api = await start_demo_api(time_scale=time_scale)
    servers.append(api)
    urls = {"DEMO_API_URL": api.url}
    web = await start_demo_web(time_scale=time_scale)
    servers.append(web)
    urls["DEMO_WEB_URL"] = web.url
    comfy = await start_demo_comfy(time_scale=time_scale)
    servers.append(comfy)
    urls["DEMO_COMFY_URL"] = comfy.url
    if not os.environ.get(DEMO_API_KEY_ENV):
        os.environ[DEMO_API_KEY_ENV] = "demo-" + secrets.token_hex(12)
    redact(os.environ[DEMO_API_KEY_ENV])
    (state_dir / DEMO_FILE).write_text(json.dumps(urls, indent=2) + "\n")
    await asyncio.to_thread(_place_inputs, input_dirs)
    return urls


def _place_inputs(input_dirs: list[Path]) -> None:
    """The sample batch's reference images, where tasks may read them (the
    first input dir); a file the operator put there is never replaced."""
    if not input_dirs:
        return
    input_dirs[0].mkdir(parents=True, exist_ok=True)
    for source in INPUTS_DIR.glob("*.png"):
        target = input_dirs[0] / source.name
        if not target.exists():
            shutil.copyfile(source, target)


async def log_in_demo_accounts(runner: WebRunner, demo_web_url: str) -> None:
    """The demo site wants a login once per account; a real site's profile has one."""
    logged_in = await login_demo_accounts(runner, demo_web_url)
    if any(logged_in.values()):
        log.info("demo accounts logged in: %s", ", ".join(a for a, new in logged_in.items() if new))


class Demo:
    """The demo's start-up step, for `Service(settings, demo=Demo())`."""

    async def start_servers(
        self, servers: list[RunningServer], settings: Settings
    ) -> dict[str, str]:
        return await start_demos(
            servers,
            time_scale=settings.time_scale,
            state_dir=settings.state_dir,
            input_dirs=settings.resolved_input_dirs,
        )

    async def log_in(self, web: WebRunner, urls: Mapping[str, str]) -> None:
        await log_in_demo_accounts(web, urls["DEMO_WEB_URL"])
