"""One small local site whose pages the web runner's tests write, the way
real sites are built, and the profiles an operator would write for them
(`site` fixture in conftest.py; the tests in test_web_real_sites.py and
test_web_site_forms.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from demo.api_media import png_bytes
from dispatcher.models import Kind, Task, new_id
from dispatcher.profiles import Profile
from dispatcher.service.serving import RunningServer
from webrunner.runner import WebRunner

if TYPE_CHECKING:
    from tests.integration.webrunner.conftest import WebEnv

MODEL = "site"


@dataclass
class Site:
    """A local site whose one page each test writes (`html`)."""

    server: RunningServer
    html: dict[str, str] = field(default_factory=dict)

    def url(self, name: str) -> str:
        return f"{self.server.url}/p/{name}"


def site_app(site_pages: dict[str, str]) -> Starlette:
    async def page(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in site_pages:
            return Response("no such page", status_code=404)
        return HTMLResponse(site_pages[name])

    async def image(request: Request) -> Response:
        return Response(png_bytes(request.path_params["seed"]), media_type="image/png")

    async def revoked(request: Request) -> Response:
        # The site's own backend: the session was revoked elsewhere.
        return JSONResponse({"error": "session expired"}, status_code=401)

    return Starlette(
        routes=[
            Route("/p/{name}", page),
            Route("/img/{seed}.png", image),
            Route("/api/generate", revoked, methods=["POST"]),
        ]
    )


COMPOSER = """<div id="app"><textarea id="q"></textarea><button id="go">Go</button>
<div id="out"></div></div>"""


def page_html(script: str, body: str = COMPOSER) -> str:
    return f"<!doctype html><html><body>{body}<script>{script}</script></body></html>"


def site_profile(site: Site, page: str, **web: Any) -> Profile:
    return Profile.model_validate(
        {
            "name": MODEL,
            "kind": "web",
            "accounts": ["demo-1"],
            "max_attempts": 3,
            "web": {
                "url": site.url(page),
                "logged_in": "#app",
                "input": "#q",
                "submit": "#go",
                "answer": "#out .answer",
                # Nominal: 100 s is 5 s real at the tests' scale, far beyond
                # what a finished answer needs when its `done` marker shows.
                "stable_ms": 100_000,
                "timeout_s": 400,
                **web,
            },
        }
    )


async def start_runner(web: WebEnv, profile: Profile) -> WebRunner:
    web.profiles = {profile.name: profile}
    runner = WebRunner(web.settings, web.profiles, web.clock, playwright=web.driver)
    web.runners.append(runner)
    await runner.start()
    return runner


def site_task(prompt: str = "a red fox") -> Task:
    task_id = new_id()
    return Task(
        id=task_id,
        model=MODEL,
        kind=Kind.WEB,
        queue=f"web:{MODEL}",
        params={"prompt": prompt},
        fingerprint=f"fp-{task_id}",
        created_at=0.0,
    )


# A page whose answer echoes the prompt and whose `done` marker is a retry
# button (the real-sites tests and `profiles try`).
RETRY_BUTTON = """
document.getElementById('go').onclick = () => {
  const q = document.getElementById('q').value;
  const out = document.getElementById('out');
  out.innerHTML = '<div class="answer"></div>';
  const words = ('echo: ' + q).split(' ');
  let i = 0;
  const tick = () => {
    out.firstChild.textContent = words.slice(0, ++i).join(' ');
    if (i < words.length) setTimeout(tick, 30);
    else out.insertAdjacentHTML('beforeend', '<button id="retry">Retry</button>');
  };
  tick();
};
"""
