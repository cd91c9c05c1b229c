"""An operator logs an account in from afar: its profile's browser, seen and driven over CDP.

The service launches the account's own profile (headless, its PID known)
while holding the account's lock, so no task opens the profile meanwhile.
The page is shown as CDP screencast frames (JPEG) and the operator's mouse,
keys, wheel and paste are replayed into it with CDP `Input.*` calls. The
same `LiveView`, without input, watches a running task's page.

Nothing here changes the dispatcher's state: `done` answers whether the
page shows the profile's `logged_in` marker, and the caller (the HTTP
layer) enables the account and re-queues its tasks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from playwright.async_api import BrowserContext, CDPSession, Page
from playwright.async_api import Error as PlaywrightError

from dispatcher.clock import Clock
from dispatcher.errors import InputError, NotFound, StateConflict
from dispatcher.profiles import WebSpec
from webrunner.browser import BrowserSession, start_browser
from webrunner.browserrun import close_logged
from webrunner.looks import login_markers

if TYPE_CHECKING:
    from webrunner.runner import WebRunner

log = logging.getLogger("dispatcher.login")

# Nominal seconds (on the service's clock) without input before a login
# session closes by itself.
LOGIN_IDLE_S = 15 * 60.0
# Real seconds the page gets to show either login marker when checked.
CHECK_S = 20.0
FRAME_QUALITY = 60
# Keys that insert no text: their DOM key name -> Windows virtual key code,
# which Chromium needs to act on them (Backspace deletes, Enter submits).
_SPECIAL_KEYS = {
    "Backspace": 8,
    "Tab": 9,
    "Enter": 13,
    "Escape": 27,
    "PageUp": 33,
    "PageDown": 34,
    "End": 35,
    "Home": 36,
    "ArrowLeft": 37,
    "ArrowUp": 38,
    "ArrowRight": 39,
    "ArrowDown": 40,
    "Delete": 46,
}
_MOUSE_ACTIONS = {"down": "mousePressed", "up": "mouseReleased", "move": "mouseMoved"}
_BUTTONS = frozenset({"left", "middle", "right", "none"})
MAX_TEXT_CHARS = 10_000


@dataclass(frozen=True)
class Frame:
    jpeg_b64: str
    width_px: float  # the page's CSS size the frame shows: input is scaled to it
    height_px: float


def input_calls(event: Mapping[str, Any], frame: Frame | None) -> list[tuple[str, dict[str, Any]]]:
    """The CDP calls that replay one operator input; InputError for a malformed one.

    Positions arrive as fractions (0..1) of the shown frame, so the page
    need not know the page's size or the image's scale.
    """
    kind = event.get("type")
    if kind == "text":
        text = event.get("text")
        if not isinstance(text, str) or not text or len(text) > MAX_TEXT_CHARS:
            raise InputError(f"text must be 1..{MAX_TEXT_CHARS} characters")
        return [("Input.insertText", {"text": text})]
    if kind == "key":
        key = event.get("key")
        if key in _SPECIAL_KEYS:
            code = _SPECIAL_KEYS[str(key)]
            base = {"key": key, "code": key, "windowsVirtualKeyCode": code}
            down = {**base, "type": "rawKeyDown"}
            if key == "Enter":
                down = {**base, "type": "keyDown", "text": "\r"}
            return [
                ("Input.dispatchKeyEvent", down),
                ("Input.dispatchKeyEvent", {**base, "type": "keyUp"}),
            ]
        if isinstance(key, str) and len(key) == 1:
            return [("Input.insertText", {"text": key})]
        raise InputError(f"key must be one character or one of {', '.join(_SPECIAL_KEYS)}")
    if kind not in ("mouse", "wheel"):
        raise InputError("type must be mouse, wheel, key or text")
    if frame is None:
        raise StateConflict("no frame shown yet: nothing to point at")
    x, y = event.get("x"), event.get("y")
    if not all(isinstance(v, int | float) and 0 <= v <= 1 for v in (x, y)):
        raise InputError("x and y must be fractions of the frame, within 0..1")
    assert isinstance(x, int | float) and isinstance(y, int | float)
    where = {"x": x * frame.width_px, "y": y * frame.height_px}
    if kind == "wheel":
        dx, dy = event.get("dx", 0), event.get("dy", 0)
        if not all(isinstance(v, int | float) and abs(v) <= 10_000 for v in (dx, dy)):
            raise InputError("dx and dy must be numbers of pixels within ±10000")
        return [
            (
                "Input.dispatchMouseEvent",
                {"type": "mouseWheel", **where, "deltaX": dx, "deltaY": dy},
            )
        ]
    action = _MOUSE_ACTIONS.get(str(event.get("action")))
    button = event.get("button", "left")
    if action is None or button not in _BUTTONS:
        raise InputError("a mouse event needs action down, up or move, and a button")
    call = {"type": action, **where, "button": button}
    if action != "mouseMoved":
        call["clickCount"] = 1
    return [("Input.dispatchMouseEvent", call)]


class LiveView:
    """A page's screencast for any number of watchers, and input into it."""

    def __init__(self, context: BrowserContext, page: Page) -> None:
        self._context = context
        self._page = page
        self._cdp: CDPSession | None = None
        self._watchers: set[asyncio.Queue[Frame | None]] = set()
        self.frame: Frame | None = None
        self._acks: set[asyncio.Task[Any]] = set()

    @property
    def page(self) -> Page:
        return self._page

    async def start(self) -> None:
        """Start the screencast; StateConflict if the page is gone (its task just ended)."""
        try:
            self._cdp = await self._context.new_cdp_session(self._page)
            # Before the start: Chromium sends no second frame until the first is acknowledged.
            self._cdp.on("Page.screencastFrame", self._on_frame)
            await self._cdp.send(
                "Page.startScreencast",
                {"format": "jpeg", "quality": FRAME_QUALITY, "everyNthFrame": 1},
            )
        except PlaywrightError as exc:
            raise StateConflict(f"the browser's page cannot be shown: {exc.message}") from exc

    def _on_frame(self, params: dict[str, Any]) -> None:
        meta = params.get("metadata") or {}
        self.frame = Frame(
            str(params["data"]),
            float(meta.get("deviceWidth") or 1280),
            float(meta.get("deviceHeight") or 900),
        )
        for queue in self._watchers:
            if queue.full():  # a slow watcher sees the newest frame, not a backlog
                queue.get_nowait()
            queue.put_nowait(self.frame)
        if self._cdp is not None:
            # Chromium sends the next frame only after this one is acknowledged.
            ack = asyncio.ensure_future(
                self._cdp.send("Page.screencastFrameAck", {"sessionId": params["sessionId"]})
            )
            self._acks.add(ack)
            ack.add_done_callback(self._acked)

    def _acked(self, ack: asyncio.Task[Any]) -> None:
        self._acks.discard(ack)
        if not ack.cancelled():
            ack.exception()  # the page may be gone: nothing to report

    @contextlib.asynccontextmanager
    async def watch(self) -> AsyncIterator[asyncio.Queue[Frame | None]]:
        """Frames as they come (the last one first); None when the view ends."""
        queue: asyncio.Queue[Frame | None] = asyncio.Queue(maxsize=1)
        if self.frame is not None:
            queue.put_nowait(self.frame)
        self._watchers.add(queue)
        try:
            yield queue
        finally:
            self._watchers.discard(queue)

    async def send_input(self, event: Mapping[str, Any]) -> None:
        if self._cdp is None:
            raise StateConflict("the live view has ended")
        for method, params in input_calls(event, self.frame):
            try:
                await self._cdp.send(method, params)
            except PlaywrightError as exc:
                raise StateConflict(f"the browser did not take the input: {exc.message}") from exc

    async def stop(self) -> None:
        for queue in self._watchers:
            if queue.full():
                queue.get_nowait()
            queue.put_nowait(None)
        cdp, self._cdp = self._cdp, None
        if cdp is not None:
            with contextlib.suppress(PlaywrightError):
                await asyncio.wait_for(cdp.send("Page.stopScreencast"), 1.0)
            with contextlib.suppress(PlaywrightError, TimeoutError):
                await asyncio.wait_for(cdp.detach(), 1.0)


async def shows_logged_in(page: Page, spec: WebSpec) -> bool:
    """Load the model's page and see which marker it shows, as a task would."""
    try:
        await page.goto(spec.url, wait_until="domcontentloaded", timeout=CHECK_S * 1000)
        await login_markers(page, spec).first.wait_for(state="visible", timeout=CHECK_S * 1000)
        return await page.locator(spec.logged_in).first.is_visible()
    except PlaywrightError:
        return False


@dataclass
class LoginSession:
    account: str
    spec: WebSpec
    clock: Clock
    view: LiveView | None = None
    pid: int | None = None
    last_input: float = 0.0
    ready: asyncio.Future[None] = field(default_factory=asyncio.Future)
    finish: asyncio.Event = field(default_factory=asyncio.Event)
    outcome: str = "cancel"  # done, cancel or idle
    runner_task: asyncio.Task[None] | None = None

    def __post_init__(self) -> None:
        self.touch()

    def touch(self) -> None:
        self.last_input = self.clock.monotonic()


class LoginDesk:
    """At most one login session per account; each holds the account's profile."""

    def __init__(self, runner: WebRunner, clock: Clock) -> None:
        self._runner = runner
        self._clock = clock
        self._idle_limit_s = clock.scaled(LOGIN_IDLE_S)
        self._sessions: dict[str, LoginSession] = {}

    def get(self, account: str) -> LoginSession:
        login = self._sessions.get(account)
        if login is None:
            raise StateConflict(f"no login session is open for {account!r}")
        return login

    def is_open(self, account: str) -> bool:
        return account in self._sessions

    def busy(self, account: str) -> None:
        if self.is_open(account):
            raise StateConflict(
                f"a login session for {account!r} is already open; finish or cancel it first"
            )

    @contextlib.asynccontextmanager
    async def hold_profile(self, account: str) -> AsyncIterator[Path]:
        """The account's profile dir, under its lock, with its kept browser closed.

        No task of the account starts while it is held (a claimed one waits).
        """
        runner = self._runner
        lock = runner.keeper.locks.get(account)
        try:
            runner.playwright  # noqa: B018 (started: every account's lock is held)
        except RuntimeError:
            lock = None
        if lock is None or account not in runner.accounts:
            raise NotFound(f"web account {account!r} is not held by this runner")
        async with lock:
            session = runner.keeper.session(account)
            if session is not None:
                # Chromium allows one browser per profile.
                await runner.keeper.forget(account)
                await close_logged(session, logging.getLogger(f"dispatcher.lane.web:{account}"))
            yield runner.user_data_dir(account)

    async def open(self, account: str) -> LoginSession:
        """Launch the account's profile under its lock and start showing it."""
        spec = self._runner.spec_for(account)
        self.busy(account)
        login = LoginSession(account, spec, self._clock)
        self._sessions[account] = login
        login.runner_task = asyncio.create_task(self._hold(login), name=f"login of {account}")
        try:
            await asyncio.shield(login.ready)
        except BaseException:
            self._sessions.pop(account, None)
            raise
        return login

    async def _hold(self, login: LoginSession) -> None:
        runner = self._runner
        session: BrowserSession | None = None
        try:
            async with self.hold_profile(login.account) as user_data_dir:
                session = await start_browser(
                    runner.playwright,
                    executable=runner.browser_executable,
                    user_data_dir=user_data_dir,
                    headless=runner.headless,
                    log=log,
                )
                login.pid = session.pid
                page = await session.page()
                with contextlib.suppress(PlaywrightError):
                    await page.goto(login.spec.url, wait_until="domcontentloaded")
                login.view = LiveView(session.context, page)
                await login.view.start()
                log.info(
                    "[web:%s] login session open (browser pid %d)",
                    login.account,
                    login.pid,
                    extra={"lane": f"web:{login.account}"},
                )
                login.touch()
                login.ready.set_result(None)
                while not login.finish.is_set():
                    left_s = self._idle_limit_s - (self._clock.monotonic() - login.last_input)
                    if left_s <= 0:
                        login.outcome = "idle"
                        break
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(login.finish.wait(), left_s)
                await login.view.stop()
                # Graceful: Chromium writes the new session cookies to disk.
                await session.close(log)
                log.info(
                    "[web:%s] login session closed (%s)",
                    login.account,
                    login.outcome,
                    extra={"lane": f"web:{login.account}"},
                )
        except BaseException as exc:
            if not login.ready.done():
                login.ready.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            log.warning(
                "[web:%s] login session failed: %s",
                login.account,
                exc,
                extra={"lane": f"web:{login.account}"},
            )
        finally:
            if session is not None and not session.closed:
                await session.abort()
            self._sessions.pop(login.account, None)

    async def _end(self, login: LoginSession, outcome: str) -> None:
        login.outcome = outcome
        login.finish.set()
        if login.runner_task is not None:
            await asyncio.shield(login.runner_task)

    async def done(self, account: str) -> bool:
        """True (and the browser closed) if the page shows `logged_in`; else it stays open."""
        login = self.get(account)
        login.touch()
        view = login.view
        assert view is not None
        if not await shows_logged_in(view.page, login.spec):
            return False
        await self._end(login, "done")
        return True

    async def cancel(self, account: str) -> None:
        await self._end(self.get(account), "cancel")

    async def import_cookies(self, account: str, cookies: list[dict[str, Any]]) -> bool:
        """Add cookies to the profile (written by a graceful close); True if now logged in."""
        spec = self._runner.spec_for(account)
        self.busy(account)
        runner = self._runner
        async with self.hold_profile(account) as user_data_dir:
            session = await start_browser(
                runner.playwright,
                executable=runner.browser_executable,
                user_data_dir=user_data_dir,
                headless=runner.headless,
                log=log,
            )
            try:
                try:
                    await session.context.add_cookies(cookies)  # type: ignore[arg-type]
                except PlaywrightError as exc:
                    raise InputError(f"the browser refused the cookies: {exc.message}") from exc
                logged_in = await shows_logged_in(await session.page(), spec)
            finally:
                await session.close(log)
        return logged_in

    async def aclose(self) -> None:
        """Cancel every open session (the service stops)."""
        for login in list(self._sessions.values()):
            await self._end(login, "cancel")
