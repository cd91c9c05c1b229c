"""The dashboard's side of the HTTP API: its page and static files, served
under a strict Content-Security-Policy, and the one-time code a client
trades for a session cookie (`/v1/dashboard-code`, `/v1/session`).

The JSON API itself is `dispatcher.http.app`, which mounts these routes.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from dispatcher import strictjson
from dispatcher.errors import NotFound
from dispatcher.http.security import SESSION_COOKIE, SESSION_TTL_S
from dispatcher.invocation import cli_command

if TYPE_CHECKING:
    from dispatcher.service.core import Service

STATIC_DIR = Path(__file__).resolve().parent / "static"
STATIC_FILES = frozenset(
    {
        "dashboard.js",
        "dashboard-pages.js",
        "dashboard-job.js",
        "dashboard-login.js",
        "dashboard.css",
    }
)
# Where a one-time link may lead after the code is redeemed: the dashboard and
# its pages only (an open redirect would lend our origin to any address).
_NEXT = re.compile(r"/(#[A-Za-z0-9/._-]{0,200})?")
# The dashboard runs only its own script and talks only to this origin.
PAGE_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self' data:; media-src 'self'; base-uri 'none'; form-action 'none'; "
        "frame-ancestors 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def _json(value: object, status: int = 200) -> Response:
    """Strict JSON, as every answer of the API (`app.JSONResponse`)."""
    return Response(strictjson.dump_bytes(value), status, media_type="application/json")


class DashboardRoutes:
    def __init__(self, service: Service) -> None:
        self.service = service

    async def session(self, request: Request) -> Response:
        """Trade a one-time code from `dispatcher dashboard` for a session cookie."""
        code = request.query_params.get("code", "")
        session = self.service.credentials.redeem_code(code) if code else None
        if session is None:
            message = (
                "the dashboard code is unknown, used or expired; "
                f"run `{cli_command()} dashboard` for a new one"
            )
            if "text/html" in request.headers.get("accept", ""):
                return HTMLResponse(
                    f"<!doctype html><title>dispatcher</title><p>{message}</p>",
                    status_code=403,
                    headers=PAGE_HEADERS,
                )
            return _json({"error": {"kind": "forbidden", "message": message}}, 403)
        # The code leaves the address bar at once; the cookie is out of scripts' reach.
        target = request.query_params.get("next", "/")
        response = RedirectResponse(
            target if _NEXT.fullmatch(target) else "/",
            status_code=303,
            headers={"Referrer-Policy": "no-referrer", "Cache-Control": "no-store"},
        )
        response.set_cookie(
            SESSION_COOKIE,
            session,
            max_age=int(SESSION_TTL_S),
            httponly=True,
            samesite="strict",
            path="/",
        )
        return response

    async def issue_code(self, request: Request) -> Response:
        return _json({"code": self.service.credentials.issue_code()})

    async def dashboard(self, request: Request) -> Response:
        return FileResponse(
            STATIC_DIR / "dashboard.html", media_type="text/html", headers=PAGE_HEADERS
        )

    async def static(self, request: Request) -> Response:
        name = request.path_params["name"]
        path = STATIC_DIR / name
        if name not in STATIC_FILES or not path.is_file():
            raise NotFound(f"no static file {name!r}")
        return FileResponse(
            path, headers={"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"}
        )


def dashboard_routes(service: Service) -> list[Route]:
    api = DashboardRoutes(service)
    return [
        Route("/v1/dashboard-code", api.issue_code, methods=["POST"]),
        Route("/v1/session", api.session, methods=["GET"]),
        Route("/", api.dashboard, methods=["GET"]),
        Route("/static/{name}", api.static, methods=["GET"]),
    ]
