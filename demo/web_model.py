"""The bundled demo web model: a small chat site that behaves like the real ones.

- ``GET /chat`` shows a login form (``#login-form``) without a valid session
  cookie, else the chat: ``#composer`` (a textarea, ``#send``, and ``#stop``,
  visible only while generating) and ``.msg.user`` / ``.msg.assistant``
  messages; a finished answer gets ``data-done``.
- The page streams the answer from ``POST /api/generate`` (server-sent
  events over a fetch), over a few seconds (x `time_scale`).
- One generation at a time per logged-in session: a second one started
  while one runs breaks both (``.error-banner`` "conversation interrupted",
  ``collisions += 1``), which is the constraint the dispatcher exists for.
- Directives in the prompt: ``[duration=2.5]`` (nominal seconds),
  ``[media=image]``, ``[media=video]``, ``[media=image,video]``,
  ``[mode=error|hang|slow|stall]`` (stall: the answer stops moving while the
  page stays busy and responsive).
- Per-user conditions (usage cap, human check, logout): ``demo/web_users.py``.
- Test hooks: ``POST /__mode`` {"mode": normal|expired|hang|error|slow|stall,
  "message"?, "duration"?} ("expired" ends every session at once),
  ``GET /__stats``, ``POST /__reset`` (counters, mode, and the sessions
  "expired" ended).

The answer echoes the prompt and says whether the instructions came first
("(brief) echo: ..." after "Answer briefly."), so a test can tell what the
runner typed.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import json
import re
import secrets
import struct
import zlib
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from playwright.async_api import Error as PlaywrightError
from playwright.async_api import Playwright, async_playwright
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Route

from demo.web_attach import ATTACH_HTML, ATTACH_JS, image_hashes
from demo.web_users import DemoUsers
from dispatcher.errors import AuthError
from dispatcher.service.serving import RunningServer, start_server
from webrunner.browser import start_browser
from webrunner.runner import WebRunner

COOKIE = "demo_session"
COOKIE_MAX_AGE_S = 30 * 24 * 3600  # persistent, so Chromium keeps it in the profile
DEFAULT_DURATION_S = 3.0
SLOW_FACTOR = 5.0
KEEPALIVE_S = 0.5
MODES = ("normal", "expired", "hang", "error", "slow", "stall")
DEFAULT_ERROR = "The model is overloaded right now. Please try again later."
COLLISION_ERROR = "conversation interrupted"
MEDIA_KEEP = 200

# The instruction a profile sends first, and how the answer shows it was read.
INSTRUCTION_MARKERS = {
    "Answer briefly.": "(brief)",
    "Think step by step.": "(step by step)",
}

_DIRECTIVE = re.compile(r"\[(duration|media|mode)=([^\]\s]*)\]")


@dataclass
class Generation:
    id: str
    broken: asyncio.Event = field(default_factory=asyncio.Event)
    stopped: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class DemoState:
    time_scale: float
    mode: str = "normal"
    message: str | None = None
    duration: float | None = None
    sessions: dict[str, str] = field(default_factory=dict)  # token -> user name
    # Sessions ended by the "expired" mode; /__reset brings them back so a
    # test can expire every session and then restore the world.
    expired: dict[str, str] = field(default_factory=dict)
    active: dict[str, Generation] = field(default_factory=dict)  # token -> generation
    media: OrderedDict[str, tuple[bytes, str]] = field(default_factory=OrderedDict)
    generations: int = 0
    collisions: int = 0
    logins: int = 0
    stops: int = 0
    reference_hashes: list[str] = field(default_factory=list)  # attached images (web_attach)
    users: DemoUsers = field(default_factory=DemoUsers)

    def stats(self) -> dict[str, Any]:
        return {
            "reference_hashes": list(self.reference_hashes),
            "generations": self.generations,
            "collisions": self.collisions,
            "logins": self.logins,
            "stops": self.stops,
            "mode": self.mode,
            "active": len(self.active),
        }

    def expire_sessions(self) -> None:
        self.expired.update(self.sessions)
        self.sessions.clear()

    def reset(self) -> None:
        self.sessions.update(self.expired)
        self.expired.clear()
        self.mode, self.message, self.duration = "normal", None, None
        self.generations = self.collisions = self.logins = self.stops = 0
        self.reference_hashes.clear()
        self.users.reset()


# -- the answer ------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    answer: str
    duration_s: float  # nominal
    media: tuple[str, ...]  # "image" and/or "video"
    mode: str


def plan_answer(text: str, state: DemoState) -> Plan:
    directives = dict(_DIRECTIVE.findall(text))
    marker = None
    body = text.strip()
    for instruction, tag in INSTRUCTION_MARKERS.items():
        if body.startswith(instruction):
            marker, body = tag, body[len(instruction) :]
            break
    prompt = " ".join(_DIRECTIVE.sub(" ", body).split())
    answer = f"{marker} echo: {prompt}" if marker else f"echo: {prompt}"
    mode = directives.get("mode") or state.mode
    try:
        duration = float(directives.get("duration", "")) if "duration" in directives else None
    except ValueError:
        duration = None
    if duration is None:
        duration = state.duration if state.duration is not None else DEFAULT_DURATION_S
    if mode == "slow":
        duration *= SLOW_FACTOR
    media = tuple(m for m in directives.get("media", "").split(",") if m in ("image", "video"))
    return Plan(answer, max(0.0, duration), media, mode)


def tiny_png(seed: int) -> bytes:
    """A real 4x4 RGB PNG whose colours depend on `seed`."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data))
            + kind
            + data
            + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
        )

    r, g, b = seed & 0xFF, (seed >> 8) & 0xFF, (seed >> 16) & 0xFF
    rows = b"".join(b"\x00" + bytes([r, g, b, 255 - r, 255 - g, 255 - b] * 2) for _ in range(4))
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", 4, 4, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def tiny_mp4(seed: int) -> bytes:
    """Not a playable video: an ``ftyp`` box and some bytes, enough to be a file."""
    ftyp = struct.pack(">I", 24) + b"ftypisom" + struct.pack(">I", 512) + b"isommp42"
    payload = seed.to_bytes(8, "big") * 32
    return ftyp + struct.pack(">I", 8 + len(payload)) + b"free" + payload


def _sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


async def _wait_any(gen: Generation, seconds: float) -> None:
    """Sleep `seconds` (real), waking early when the generation breaks or stops."""
    waiters = [asyncio.ensure_future(gen.broken.wait()), asyncio.ensure_future(gen.stopped.wait())]
    try:
        await asyncio.wait(waiters, timeout=max(0.0, seconds), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)


# -- the app -----------------------------------------------------------------


def create_app(time_scale: float = 1.0) -> Starlette:
    if time_scale <= 0:
        raise ValueError("time_scale must be positive")
    state = DemoState(time_scale=time_scale)

    def session_of(request: Request) -> str | None:
        token = request.cookies.get(COOKIE)
        if not token or token not in state.sessions:
            return None
        return None if state.users.signed_out(state.sessions[token]) else token

    async def root(request: Request) -> Response:
        return RedirectResponse("/chat", status_code=303)

    async def chat(request: Request) -> Response:
        token = session_of(request)
        if token is None:
            return HTMLResponse(_LOGIN_PAGE.replace("{error}", ""))
        user = state.sessions[token]
        page = _CHAT_PAGE.replace("{user}", html.escape(user)).replace("{attach}", ATTACH_HTML)
        page = page.replace("{notice}", state.users.notice_html(user))
        return HTMLResponse(page.replace("{script}", ATTACH_JS + _CHAT_JS))

    async def login(request: Request) -> Response:
        form = parse_qs((await request.body()).decode("utf-8", "replace"))
        username = (form.get("username") or [""])[0].strip()
        password = (form.get("password") or [""])[0]
        if not username or not password:
            page = _LOGIN_PAGE.replace(
                "{error}", '<p class="error-banner">Enter a user name and a password.</p>'
            )
            return HTMLResponse(page, status_code=400)
        token = secrets.token_urlsafe(24)
        state.sessions[token] = username
        state.logins += 1
        response = RedirectResponse("/chat", status_code=303)
        response.set_cookie(
            COOKIE, token, max_age=COOKIE_MAX_AGE_S, httponly=True, samesite="lax", path="/"
        )
        return response

    async def generate(request: Request) -> Response:
        token = session_of(request)
        if token is None:
            return JSONResponse({"error": "session expired"}, status_code=401)
        try:
            sent = await request.json()
            text = str(sent["text"])
            images = image_hashes(sent.get("images"))
        except (ValueError, KeyError, TypeError, AttributeError):
            images = None
        if images is None:
            return JSONResponse(
                {"error": 'send JSON {"text": ..., "images": [data URLs]}'}, status_code=400
            )
        state.reference_hashes.extend(images)
        notice = state.users.notice(state.sessions[token])
        if notice is not None:
            # A capped or checked user gets the notice instead of an answer.
            cls, message = notice
            event = _sse("notice", {"cls": cls, "text": message})
            return Response(event, media_type="text/event-stream")
        state.generations += 1
        gen = Generation(id=secrets.token_hex(6))
        running = state.active.get(token)
        if running is not None:
            # The real sites' rule: two generations in one conversation
            # break each other.
            state.collisions += 1
            running.broken.set()
            state.active.pop(token, None)
            gen.broken.set()
        else:
            state.active[token] = gen
        plan = plan_answer(text, state)
        return StreamingResponse(
            _stream(token, gen, plan),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store"},
        )

    async def _stream(token: str, gen: Generation, plan: Plan) -> AsyncIterator[bytes]:
        try:
            yield _sse("start", {"id": gen.id})
            words = plan.answer.split(" ")
            pieces = [w + (" " if i < len(words) - 1 else "") for i, w in enumerate(words)]
            tick = plan.duration_s * state.time_scale / max(1, len(pieces))
            for index, piece in enumerate(pieces):
                await _wait_any(gen, tick)
                if gen.broken.is_set():
                    yield _sse("error", {"message": COLLISION_ERROR})
                    return
                if gen.stopped.is_set():
                    yield _sse("stopped", {})
                    return
                yield _sse("chunk", {"text": piece})
                if plan.mode == "error" and index >= len(pieces) // 3:
                    yield _sse("error", {"message": state.message or DEFAULT_ERROR})
                    return
                if plan.mode in ("hang", "stall") and index >= len(pieces) // 3:
                    if plan.mode == "hang":
                        yield _sse("hang", {})
                    # Never finishes: keep the connection open until the
                    # browser goes away (or stop / a collision).
                    while not (gen.broken.is_set() or gen.stopped.is_set()):
                        yield b": keepalive\n\n"
                        await _wait_any(gen, KEEPALIVE_S)
                    return
            for index, kind in enumerate(plan.media):
                seed = int(gen.id, 16) + index
                if kind == "image":
                    name, blob, ctype = f"{gen.id}-{index}.png", tiny_png(seed), "image/png"
                else:
                    name, blob, ctype = f"{gen.id}-{index}.mp4", tiny_mp4(seed), "video/mp4"
                state.media[name] = (blob, ctype)
                while len(state.media) > MEDIA_KEEP:
                    state.media.popitem(last=False)
                yield _sse("media", {"kind": kind, "src": f"/media/{name}"})
            yield _sse("done", {})
        finally:
            if state.active.get(token) is gen:
                del state.active[token]

    async def stop(request: Request) -> Response:
        token = session_of(request)
        if token is None:
            return JSONResponse({"error": "session expired"}, status_code=401)
        gen = state.active.pop(token, None)
        if gen is None:
            return JSONResponse({"stopped": False})
        state.stops += 1
        gen.stopped.set()
        return JSONResponse({"stopped": True})

    async def media(request: Request) -> Response:
        if session_of(request) is None:
            return JSONResponse({"error": "log in to see this file"}, status_code=401)
        found = state.media.get(request.path_params["name"])
        if found is None:
            return JSONResponse({"error": "no such file"}, status_code=404)
        blob, kind = found
        return Response(blob, media_type=kind, headers={"Cache-Control": "private"})

    async def set_mode(request: Request) -> Response:
        try:
            body = await request.json()
            mode = body["mode"]
        except (ValueError, KeyError, TypeError):
            return JSONResponse({"error": 'send JSON {"mode": ...}'}, status_code=400)
        if mode not in MODES:
            return JSONResponse({"error": f"mode must be one of {list(MODES)}"}, status_code=400)
        state.mode = mode
        state.message = body.get("message") if isinstance(body.get("message"), str) else None
        duration = body.get("duration")
        state.duration = float(duration) if isinstance(duration, int | float) else None
        if mode == "expired":
            state.expire_sessions()
        return JSONResponse(state.stats())

    async def stats(request: Request) -> Response:
        return JSONResponse(state.stats())

    async def reset(request: Request) -> Response:
        state.reset()
        return JSONResponse(state.stats())

    app = Starlette(
        routes=[
            Route("/", root),
            Route("/chat", chat),
            Route("/login", login, methods=["POST"]),
            Route("/api/generate", generate, methods=["POST"]),
            Route("/api/stop", stop, methods=["POST"]),
            Route("/media/{name}", media),
            Route("/__mode", set_mode, methods=["POST"]),
            Route("/__stats", stats),
            Route("/__reset", reset, methods=["POST"]),
            Route("/__users/{username}", state.users.control, methods=["POST"]),
        ]
    )
    app.state.demo = state
    return app


async def start_demo_web(port: int | None = None, time_scale: float = 1.0) -> RunningServer:
    """Serve the demo web model on 127.0.0.1; its chat page is at ``<url>/chat``."""
    return await start_server(create_app(time_scale), port)


# Real seconds a login's browser is given to exit (and save its session).
LOGIN_CLOSE_GRACE_S = 20.0


async def demo_login(
    browser_executable: str,
    user_data_dir: Path,
    url: str,
    *,
    username: str = "demo",
    password: str = "demo",
    headless: bool = True,
    playwright: Playwright | None = None,
) -> bool:
    """Log one account's browser profile into the demo, once.

    Opens Chromium on `user_data_dir`, fills the demo's login form if it is
    shown, and closes the browser gracefully so the (persistent) session
    cookie is written into the profile; the web runner then finds the
    account logged in, as it would on a real site. Returns True if it logged
    in, False if the profile already was. Call it before the account's lane
    runs tasks: one Chromium per profile at a time.
    """
    own = playwright is None
    manager = async_playwright() if own else None
    pw = await manager.start() if manager is not None else playwright
    assert pw is not None
    try:
        session = await start_browser(
            pw, executable=browser_executable, user_data_dir=user_data_dir, headless=headless
        )
        try:
            page = await session.page()
            await page.goto(url, wait_until="domcontentloaded")
            ready = page.locator("#composer").or_(page.locator("#login-form")).first
            await ready.wait_for(state="visible", timeout=30_000)
            if await page.locator("#composer").is_visible():
                return False
            await page.fill("#login-form input[name=username]", username)
            await page.fill("#login-form input[name=password]", password)
            await page.click("#login-form button[type=submit]")
            await page.locator("#composer").wait_for(state="visible", timeout=30_000)
            return True
        except PlaywrightError as exc:
            raise AuthError(f"could not log {user_data_dir} into {url}: {exc.message}") from exc
        finally:
            # Time to exit by itself: a browser killed before its shutdown has
            # written the session cookie leaves the profile logged out. A task's
            # 3 s can run out with three systems starting their browsers at
            # once on two cores (the likely cause of a benchmark peer whose
            # page never showed its composer).
            await session.close(grace_s=LOGIN_CLOSE_GRACE_S)
    finally:
        if manager is not None:
            with contextlib.suppress(Exception):
                await pw.stop()


async def login_demo_accounts(runner: WebRunner, demo_web_url: str) -> dict[str, bool]:
    """Log in every account of `runner` that serves a model on the demo site.

    For ``--demo``: call after ``runner.start()`` (the accounts are locked,
    no task runs yet). The profiles are distinct, so they log in at once,
    each under its own user name (the account's name).
    Returns {account: True if it had to log in}.
    """
    profiles = runner.web_profiles
    on_demo_site = {
        name
        for name, profile in profiles.items()
        if profile.web is not None and profile.web.url.startswith(demo_web_url)
    }
    # Added at run time too (`accounts add`): each account's lane's models.
    accounts = sorted(a for a in runner.accounts if on_demo_site & set(runner.models_of(a)))
    done = await asyncio.gather(
        *(
            demo_login(
                runner.browser_executable,
                runner.user_data_dir(account),
                f"{demo_web_url}/chat",
                # Each account its own user, so a test can cap or sign out one.
                username=account,
                headless=runner.headless,
                playwright=runner.playwright,
            )
            for account in accounts
        )
    )
    return dict(zip(accounts, done, strict=True))


_STYLE = """<style>
body { font: 15px/1.4 system-ui, sans-serif; max-width: 760px; margin: 2em auto; }
.msg { padding: .6em .8em; margin: .4em 0; border-radius: 8px; white-space: pre-wrap; }
.msg.user { background: #eef; } .msg.assistant { background: #f4f4f4; }
.error-banner { background: #fdd; color: #900; padding: .6em .8em; border-radius: 8px; }
#composer { display: flex; gap: .5em; margin-top: 1em; }
#composer textarea { flex: 1; } img.result, video.result { display: block; width: 64px; }
</style>"""

_LOGIN_PAGE = (
    "<!doctype html><html><head><meta charset='utf-8'><title>Demo chat: sign in</title>"
    + _STYLE
    + """</head><body><h1>Sign in to the demo chat</h1>{error}
<form id="login-form" method="post" action="/login">
<p><label>User name <input name="username" autocomplete="username"></label></p>
<p><label>Password <input name="password" type="password"
 autocomplete="current-password"></label></p>
<p><button type="submit">Sign in</button></p></form></body></html>"""
)

_CHAT_PAGE = (
    "<!doctype html><html><head><meta charset='utf-8'><title>Demo chat</title>"
    + _STYLE
    + """</head><body><header>Demo chat, signed in as <b>{user}</b></header>
<div id="messages">{notice}</div>
<form id="composer" onsubmit="return false">
<textarea name="prompt" rows="3" placeholder="Message the demo model"></textarea>
{attach}
<button id="send" type="button">Send</button>
<button id="stop" type="button" hidden>Stop</button>
</form><script>{script}</script></body></html>"""
)

_CHAT_JS = """
const messages = document.getElementById('messages');
const box = document.querySelector('#composer textarea');
const send = document.getElementById('send');
const stop = document.getElementById('stop');
let generating = false;
function add(cls, text) {
  const el = document.createElement('div');
  el.className = 'msg ' + cls; el.textContent = text; messages.appendChild(el); return el;
}
function banner(text) {
  const el = document.createElement('div');
  el.className = 'error-banner'; el.setAttribute('role', 'alert'); el.textContent = text;
  messages.appendChild(el);
}
function finish() { generating = false; stop.hidden = true; send.disabled = false; }
async function go() {
  const text = box.value;
  if (!text.trim() || generating) return;
  generating = true; send.disabled = true; stop.hidden = false;
  const images = takeAttachments(add('user', text)); box.value = '';
  const answer = add('assistant', '');
  const body = document.createElement('span'); answer.appendChild(body);
  let res;
  try {
    res = await fetch('/api/generate', {method: 'POST',
      headers: {'content-type': 'application/json'}, body: JSON.stringify({text, images})});
  } catch (e) { banner('network error: ' + e); finish(); return; }
  if (res.status === 401) { location.href = '/chat'; return; }
  if (!res.ok) { banner('error ' + res.status); finish(); return; }
  const reader = res.body.getReader(); const dec = new TextDecoder(); let buf = '';
  const handle = (ev, msg) => {
    if (ev === 'chunk') body.textContent += msg.text;
    else if (ev === 'media') {
      const el = document.createElement(msg.kind === 'video' ? 'video' : 'img');
      el.className = 'result'; if (msg.kind === 'video') el.preload = 'none';
      el.src = msg.src; answer.appendChild(el);
    } else if (ev === 'done') { answer.dataset.done = '1'; finish(); }
    else if (ev === 'stopped') { answer.dataset.stopped = '1'; finish(); }
    else if (ev === 'error') { answer.dataset.error = '1'; banner(msg.message); finish(); }
    else if (ev === 'hang') { while (true) {} }
    else if (ev === 'notice') {
      const el = document.createElement('div'); el.className = msg.cls;
      el.setAttribute('role', 'alert'); el.textContent = msg.text; messages.appendChild(el);
      finish();
    }
  };
  try {
    for (;;) {
      const {value, done} = await reader.read();
      if (done) break;
      buf += dec.decode(value, {stream: true});
      let i;
      while ((i = buf.indexOf('\\n\\n')) >= 0) {
        const raw = buf.slice(0, i); buf = buf.slice(i + 2);
        let ev = 'message', data = '';
        for (const line of raw.split('\\n')) {
          if (line.startsWith('event: ')) ev = line.slice(7);
          else if (line.startsWith('data: ')) data += line.slice(6);
        }
        if (data) handle(ev, JSON.parse(data));
      }
    }
  } catch (e) { banner('connection lost: ' + e); }
  if (generating) finish();
}
send.addEventListener('click', go);
stop.addEventListener('click', () => fetch('/api/stop', {method: 'POST'}));
box.addEventListener('keydown', (e) => {
  if (e.key === 'Enter' && !e.shiftKey) { e.preventDefault(); go(); }
});
"""
