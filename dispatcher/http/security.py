"""Guards in front of every request: loopback Host, body size, the local token.

The token is random per start, stored 0600 in the state dir, compared in
constant time, and never logged. The dashboard page trades a short-lived
one-time code for an HttpOnly, SameSite=Strict session cookie instead, so
the token itself never reaches anything a page script can read.
"""

from __future__ import annotations

import hmac
import json
import re
import secrets
import time
from dataclasses import dataclass, field

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dispatcher.http.limits import JOBS_PATH, MAX_BODY_BYTES, MAX_JOB_BODY_BYTES, PLAN_PATH
from dispatcher.invocation import cli_command
from dispatcher.logs import forget, redact
from dispatcher.tasks.inputfiles import size_text

SESSION_COOKIE = "dispatcher_session"
ONE_TIME_CODE_TTL_S = 120.0
SESSION_TTL_S = 12 * 3600.0

# Reachable without the token: the dashboard shell (it shows no data by
# itself), the one-time-code exchange that gives it a session, and `/livez`
# for process monitors (it says "alive" and nothing else).
PUBLIC_PATHS = frozenset(
    {
        "/",
        "/v1/session",
        "/livez",
        "/static/dashboard.js",
        "/static/dashboard-pages.js",
        "/static/dashboard-job.js",
        "/static/dashboard.css",
        "/static/dashboard-login.js",
    }
)
# Only the token opens these: a dashboard session must not mint more sessions.
TOKEN_ONLY_PATHS = frozenset({"/v1/dashboard-code"})
# Writes made with the session cookie must carry this header. A cross-site page
# cannot add a custom header without a CORS preflight, which is never granted;
# SameSite=Strict already keeps the cookie off cross-site requests, so this is
# defence in depth against CSRF.
CSRF_HEADER = b"x-requested-with"
CSRF_VALUE = "dispatcher-dashboard"
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


_LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "[::1]"})
# name, then optionally ":" and ASCII digits; a bracketed IPv6 literal ends at "]".
_HOST_SHAPE = re.compile(r"(?P<name>\[[^\]]*\]|[^:\[\]]*)(?::[0-9]+)?")


def host_is_loopback(host_header: str) -> bool:
    """True only for exactly 127.0.0.1, localhost or [::1], with an optional :port.

    Parsed whole, not split on ":" or "]": ``[::1]evil.com`` or
    ``localhost:80evil`` are other names, and a name matches exactly.
    """
    match = _HOST_SHAPE.fullmatch(host_header)
    return match is not None and match["name"].lower() in _LOOPBACK_NAMES


@dataclass
class Credentials:
    token: str
    _codes: dict[str, float] = field(default_factory=dict)
    _sessions: dict[str, float] = field(default_factory=dict)

    @classmethod
    def fresh(cls) -> Credentials:
        return cls(token=secrets.token_urlsafe(32))

    def token_matches(self, presented: str) -> bool:
        return hmac.compare_digest(presented.encode(), self.token.encode())

    def _prune(self) -> None:
        now = time.monotonic()
        for code in [c for c, expires in self._codes.items() if expires < now]:
            del self._codes[code]
        for session in [s for s, expires in self._sessions.items() if expires < now]:
            del self._sessions[session]
            forget(session)

    def issue_code(self) -> str:
        self._prune()
        code = secrets.token_urlsafe(24)
        self._codes[code] = time.monotonic() + ONE_TIME_CODE_TTL_S
        return code

    def redeem_code(self, code: str) -> str | None:
        """A session id for a valid unused code; each code works once."""
        expires = self._codes.pop(code, None)
        if expires is None or expires < time.monotonic():
            return None
        session = secrets.token_urlsafe(32)
        redact(session)  # a session is as good as the token for reading: never logged
        self._sessions[session] = time.monotonic() + SESSION_TTL_S
        return session

    def session_valid(self, session: str) -> bool:
        expires = self._sessions.get(session)
        return expires is not None and expires >= time.monotonic()


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key == name:
            return str(value.decode("latin-1"))
    return None


def _cookie(scope: Scope, name: str) -> str | None:
    raw = _header(scope, b"cookie")
    if not raw:
        return None
    for part in raw.split(";"):
        key, _, value = part.strip().partition("=")
        if key == name:
            return value
    return None


async def _reject(send: Send, status: int, kind: str, message: str) -> None:
    body = json.dumps({"error": {"kind": kind, "message": message}}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"x-dispatcher", b"1"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def body_limit(scope: Scope) -> int:
    """The most bytes a request may carry: a job of 10,000 tasks needs more than 1 MiB."""
    if scope["path"] in (JOBS_PATH, PLAN_PATH) and scope.get("method") == "POST":
        return MAX_JOB_BODY_BYTES
    return MAX_BODY_BYTES


def too_large_message(scope: Scope, limit: int) -> str:
    return (
        f"request body over {size_text(limit)} ({limit} bytes), the most "
        f"{scope.get('method', 'GET')} {scope['path']} takes"
    )


class SecurityMiddleware:
    def __init__(self, app: ASGIApp, credentials: Credentials) -> None:
        self.app = app
        self.credentials = credentials

    def _authorized(self, scope: Scope) -> tuple[bool | None, str]:
        """(True/False for a presented credential or None when none was, which kind)."""
        auth = _header(scope, b"authorization")
        if auth is not None:
            scheme, _, value = auth.partition(" ")
            ok = scheme.lower() == "bearer" and self.credentials.token_matches(value.strip())
            return ok, "token"
        local = _header(scope, b"x-local-token")
        if local is not None:
            return self.credentials.token_matches(local.strip()), "token"
        session = _cookie(scope, SESSION_COOKIE)
        if session is not None:
            return self.credentials.session_valid(session), "session"
        return None, ""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        hosts = sum(1 for key, _ in scope.get("headers", []) if key == b"host")
        if hosts > 1:
            # Parsers and proxies disagree on which one counts: the guard below
            # could check one name while something else acts on the other.
            await _reject(send, 400, "invalid", f"exactly one Host header, not {hosts}")
            return
        host = _header(scope, b"host") or ""
        if not host_is_loopback(host):
            # DNS rebinding: a page on evil.example resolving to 127.0.0.1.
            await _reject(send, 403, "host", "Host must be a loopback name (127.0.0.1, localhost)")
            return
        limit = body_limit(scope)
        length = _header(scope, b"content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            await _reject(send, 413, "too_large", too_large_message(scope, limit))
            return
        if scope["path"] not in PUBLIC_PATHS:
            verdict, how = self._authorized(scope)
            if verdict is None:
                await _reject(
                    send,
                    401,
                    "unauthorized",
                    "missing token: send Authorization: Bearer <token> or X-Local-Token",
                )
                return
            if verdict is False and how == "session":
                await _reject(
                    send,
                    403,
                    "forbidden",
                    "the dashboard session is unknown or expired (the service "
                    f"restarts forget sessions); run `{cli_command()} dashboard` "
                    "for a new link",
                )
                return
            if verdict is False:
                await _reject(
                    send, 403, "forbidden", "wrong or stale token (it changes at every start)"
                )
                return
            if how == "session" and scope["path"] in TOKEN_ONLY_PATHS:
                await _reject(send, 403, "forbidden", "this endpoint needs the token")
                return
            if (
                how == "session"
                and scope.get("method", "GET") not in _SAFE_METHODS
                and _header(scope, CSRF_HEADER) != CSRF_VALUE
            ):
                await _reject(
                    send,
                    403,
                    "forbidden",
                    f"a write with the dashboard session needs the header "
                    f"X-Requested-With: {CSRF_VALUE}",
                )
                return

        # Buffer the body here (it is within `limit`) so that an oversized chunked
        # upload is refused before any handler sees a byte of it.
        chunks: list[bytes] = []
        received = 0
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            chunk = message.get("body", b"")
            received += len(chunk)
            if received > limit:
                await _reject(send, 413, "too_large", too_large_message(scope, limit))
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


class RefuseNul:
    """A NUL in a request's URL never reaches a query (PostgreSQL refuses it
    there: a 500). In the path it names nothing (404, as the API documents
    for an unknown id); in the query it is bad input (400)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            if "\x00" in scope["path"]:
                message = "no such id: an id holds no NUL character (%00)"
                await _reject(send, 404, "not_found", message)
                return
            if b"%00" in scope["query_string"]:
                message = "the query holds a NUL character (%00); no name or search can hold one"
                await _reject(send, 400, "invalid", message)
                return
        await self.app(scope, receive, send)
