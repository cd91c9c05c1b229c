"""The demo's start-up step for in-process test services, with the accounts'
logins done once per test process instead of once per service.

`demo.bootstrap.Demo` logs each web account in with a Chromium of its own
(start, fill the form, close gracefully to write the cookie): seconds per
service on a loaded machine, paid again by every test that starts one. Here
the first service in a process does that real login, and its profiles are
kept as templates with the session each holds. A later service's fresh
account gets a copy of its template, and its own demo site (a new server,
with no sessions) is told that session, as if the login had happened there:
the account's own browser then finds it logged in, as after a real login.
A profile a test already used (a restart on the same state dir) gets the
real login, as `Demo` does. The webrunner tests copy one logged-in profile
the same way (tests/integration/webrunner/conftest.py).
"""

from __future__ import annotations

import asyncio
import atexit
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from starlette.applications import Starlette

from demo.bootstrap import Demo
from demo.web_model import DemoState, demo_login
from dispatcher.service.serving import RunningServer
from dispatcher.settings import Settings

if TYPE_CHECKING:
    from webrunner.runner import WebRunner


@dataclass(frozen=True)
class Template:
    profile: Path  # a logged-in profile dir, never used by a browser again
    token: str  # its demo_session cookie


# The lock of the browser that made it, and caches: only the session matters.
_NOT_COPIED = shutil.ignore_patterns("Singleton*", "*Cache", "History*")

_templates: dict[str, Template] = {}  # by account (each account its own demo user)
_home: Path | None = None


def _templates_dir() -> Path:
    global _home
    if _home is None:
        _home = Path(tempfile.mkdtemp(prefix="dispatcher-demo-logins-"))
        atexit.register(shutil.rmtree, _home, True)
    return _home


def _is_used(profile: Path) -> bool:
    """A Chromium has run on it: it holds whatever session that run left."""
    return (profile / "Local State").exists()


class TemplatedDemo(Demo):
    """`Demo`, with each account's login copied from this process's first one."""

    def __init__(self) -> None:
        self.site: DemoState | None = None

    async def start_servers(
        self, servers: list[RunningServer], settings: Settings
    ) -> dict[str, str]:
        urls = await super().start_servers(servers, settings)
        web = next(s for s in servers if s.url == urls["DEMO_WEB_URL"])
        app = web.server.config.app
        assert isinstance(app, Starlette)
        site = app.state.demo
        assert isinstance(site, DemoState)
        self.site = site
        return urls

    async def log_in(self, web: WebRunner, urls: Mapping[str, str]) -> None:
        site = self.site
        assert site is not None, "log_in before start_servers"
        for user, known in _templates.items():
            site.sessions[known.token] = user
        chat = f"{urls['DEMO_WEB_URL']}/chat"
        on_site = {
            name
            for name, profile in web.web_profiles.items()
            if profile.web is not None and profile.web.url.startswith(urls["DEMO_WEB_URL"])
        }
        to_log_in = []
        copies = []
        for account in web.accounts:
            if not on_site & set(web.models_of(account)):
                continue
            template = _templates.get(account)
            target = web.user_data_dir(account)
            if template is not None and not _is_used(target):
                copies.append(
                    asyncio.to_thread(
                        shutil.copytree, template.profile, target, symlinks=True, dirs_exist_ok=True
                    )
                )
            else:
                to_log_in.append(account)
        await asyncio.gather(*copies)
        # As `Demo` does it: a new name, or a profile a browser used before.
        logged_in = await asyncio.gather(
            *(
                demo_login(
                    web.browser_executable,
                    web.user_data_dir(account),
                    chat,
                    username=account,
                    headless=web.headless,
                    playwright=web.playwright,
                )
                for account in to_log_in
            )
        )
        tokens = {user: token for token, user in site.sessions.items()}
        for account, new in zip(to_log_in, logged_in, strict=True):
            if new and account not in _templates:
                copy = _templates_dir() / account
                await asyncio.to_thread(
                    shutil.copytree,
                    web.user_data_dir(account),
                    copy,
                    symlinks=True,
                    ignore=_NOT_COPIED,
                )
                _templates[account] = Template(profile=copy, token=tokens[account])
