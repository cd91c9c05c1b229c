"""What a task's browser may do beyond its own tab: hosts, popups, downloads.

Chromium by itself loads whatever a page asks for. For a task run (not an
operator's login, which may need a sign-in popup) we:

- close every popup a page opens (`window.open`, `target=_blank`), at once;
- with `[web] allow_hosts`, abort at the request level (Playwright routes)
  every http(s) request and websocket to a host not listed (nor the
  profile's own `url`);
- deny downloads, unless the profile sets `[web] downloads = true`: then
  they go into the state dir next to the browser profile, and one that
  passes the download cap is cancelled and its file removed. Their number is
  bounded too (`MAX_DOWNLOADS_AT_ONCE` in progress, `MAX_DOWNLOADS_PER_TASK`
  begun), and so is their duration: a task's end (its browser kept for the
  next) cancels what is still downloading and empties the folder, as a new
  browser's start does, and one that begins between tasks is cancelled.
  Nothing reads these files: a site may need its download to succeed, the
  dispatcher's results come from the answer.

Without the policy a download went to Playwright's artifacts folder under
the system temp dir and grew unbounded while the browser lived.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import shutil
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from playwright.async_api import BrowserContext, CDPSession, Page, Route, WebSocketRoute
from playwright.async_api import Error as PlaywrightError

from dispatcher.errors import TransientError

if TYPE_CHECKING:
    from dispatcher.profiles import WebSpec
    from webrunner.browser import BrowserSession

log = logging.getLogger("dispatcher.webrunner.guard")

_GUID = re.compile(r"[A-Za-z0-9-]{1,64}")
_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}


def _origin(url: str) -> tuple[str, int] | None:
    """(host, port) of an http(s)/ws(s) URL; None for other schemes (data:, blob:)."""
    try:
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in _DEFAULT_PORTS or not parts.hostname:
            return None
        return parts.hostname.lower().rstrip("."), parts.port or _DEFAULT_PORTS[scheme]
    except ValueError:
        return ("", 0)  # a malformed URL matches no listed host


@dataclass(frozen=True)
class BrowserPolicy:
    # Empty: any host. Else entries "host" (any port), "host:port" or "*.domain".
    allow_hosts: frozenset[str]
    downloads_dir: Path | None  # None: downloads denied
    max_download_bytes: int

    def allows(self, url: str) -> bool:
        if not self.allow_hosts:
            return True
        origin = _origin(url)
        if origin is None:
            return True  # nothing leaves the browser for data: or blob:
        host, port = origin
        for entry in self.allow_hosts:
            if entry.startswith("*."):
                if host.endswith(entry[1:]):
                    return True
            elif entry in (host, f"{host}:{port}"):
                return True
        return False


def policy_for(spec: WebSpec, downloads_dir: Path, default_max_bytes: int) -> BrowserPolicy:
    allowed: frozenset[str] = frozenset()
    if spec.allow_hosts:
        own = _origin(spec.url)
        entries = {h.lower().rstrip(".") for h in spec.allow_hosts}
        if own is not None:
            entries.add(f"{own[0]}:{own[1]}")  # the model's page itself, always
        allowed = frozenset(entries)
    return BrowserPolicy(
        allow_hosts=allowed,
        downloads_dir=downloads_dir if spec.downloads else None,
        max_download_bytes=spec.max_download_bytes or default_max_bytes,
    )


def downloads_dir_for(user_data_dir: Path) -> Path:
    return user_data_dir.parent / f"{user_data_dir.name}.downloads"


# A popup whose opener closed before its "page" event was handled has no
# opener any more: a page is ours only if we opened it, so each guard knows
# the tabs opened through `own_page`.
_GUARDS: weakref.WeakKeyDictionary[BrowserContext, Guard] = weakref.WeakKeyDictionary()
OWN_PAGE_WAIT_S = 5.0
# A page could start downloads one after another, each under the size cap:
# the folder would grow by the cap per download for as long as the browser
# is kept. Past these counts a download is cancelled as it begins.
MAX_DOWNLOADS_AT_ONCE = 4
MAX_DOWNLOADS_PER_TASK = 16
SETTLE_S = 5.0


async def own_page(context: BrowserContext) -> Page:
    """A new tab of ours (not a page's popup) in a browser that may be guarded."""
    guard = _GUARDS.get(context)
    return await (guard.new_page() if guard is not None else context.new_page())


class Guard:
    """The policy in force on one browser, changed when a task of another model needs it."""

    def __init__(self, session: BrowserSession) -> None:
        self._session = session
        self.policy: BrowserPolicy | None = None
        self._cdp: CDPSession | None = None
        self._routed = False
        self.popups_closed = 0
        self.blocked: list[str] = []
        self.downloads_cancelled = 0
        # The guids of the downloads in progress, and how many began since
        # the last task's end (`settle`).
        self._downloading: set[str] = set()
        self._downloads_begun = 0
        self._between_tasks = False  # from a task's end (`settle`) to the next `apply`
        self._cancels: set[asyncio.Task[None]] = set()
        self._cancelled: set[str] = set()
        self._own: weakref.WeakSet[Page] = weakref.WeakSet()
        self._opening = 0
        self._opened = asyncio.Condition()
        _GUARDS[session.context] = self
        session.context.on("page", self._on_page)

    async def new_page(self) -> Page:
        """A tab of ours: its "page" event must not take it for a popup."""
        self._opening += 1
        try:
            page = await self._session.context.new_page()
            self._own.add(page)
            return page
        finally:
            self._opening -= 1
            async with self._opened:
                self._opened.notify_all()

    async def _on_page(self, page: Page) -> None:
        try:
            opener = await page.opener()
        except PlaywrightError:
            return
        if opener is None:
            # No opener: ours, or a popup whose opener has closed meanwhile
            # (a task's tab is closed after its answer). Ours are known once
            # the `new_page` that opened them has returned.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(OWN_PAGE_WAIT_S), self._opened:
                    await self._opened.wait_for(lambda: self._opening == 0)
            if page in self._own:
                return
        with contextlib.suppress(PlaywrightError):
            await page.close()
        self.popups_closed += 1  # counted once gone

    async def apply(self, policy: BrowserPolicy) -> None:
        """The policy of the task about to run (each task's start)."""
        self._between_tasks = False
        if policy == self.policy:
            return
        context = self._session.context
        if self._routed:
            await context.unroute_all(behavior="ignoreErrors")
            self._routed = False
        if policy.allow_hosts:
            await context.route("**/*", self._route)
            await context.route_web_socket("**/*", self._route_ws)
            self._routed = True
        await self._set_downloads(policy)
        self.policy = policy

    async def _route(self, route: Route) -> None:
        url = route.request.url
        policy = self.policy
        with contextlib.suppress(PlaywrightError):
            if policy is None or policy.allows(url):
                await route.fallback()
            else:
                self._block(url)
                await route.abort("blockedbyclient")

    async def _route_ws(self, ws: WebSocketRoute) -> None:
        policy = self.policy
        if policy is None or policy.allows(ws.url):
            ws.connect_to_server()
        else:
            self._block(ws.url)
            with contextlib.suppress(PlaywrightError):
                await ws.close(code=1008, reason="host not allowed")

    def _block(self, url: str) -> None:
        if len(self.blocked) < 100:  # a count for the log, not a record of the page
            self.blocked.append(url[:200])

    async def _set_downloads(self, policy: BrowserPolicy) -> None:
        if self._cdp is None:
            self._cdp = await self._session.browser.new_browser_cdp_session()
            self._cdp.on("Browser.downloadWillBegin", self._on_begin)
            self._cdp.on("Browser.downloadProgress", self._on_progress)
        target = policy.downloads_dir
        if target is None:
            await self._cdp.send("Browser.setDownloadBehavior", {"behavior": "deny"})
            return
        target.mkdir(mode=0o700, parents=True, exist_ok=True)
        await self._cdp.send(
            "Browser.setDownloadBehavior",
            {"behavior": "allowAndName", "downloadPath": str(target), "eventsEnabled": True},
        )

    def _on_begin(self, event: dict[str, Any]) -> None:
        policy = self.policy
        guid = str(event.get("guid") or "")
        if policy is None or policy.downloads_dir is None or not _GUID.fullmatch(guid):
            return
        self._downloads_begun += 1
        if self._between_tasks:
            self._cancel_download(guid, "no task was running")
        elif len(self._downloading) >= MAX_DOWNLOADS_AT_ONCE:
            self._cancel_download(guid, f"{MAX_DOWNLOADS_AT_ONCE} were in progress already")
        elif self._downloads_begun > MAX_DOWNLOADS_PER_TASK:
            self._cancel_download(guid, f"{MAX_DOWNLOADS_PER_TASK} began during this task")
        else:
            self._downloading.add(guid)

    def _on_progress(self, event: dict[str, Any]) -> None:
        policy = self.policy
        if policy is None or policy.downloads_dir is None:
            return
        guid = str(event.get("guid") or "")
        state = event.get("state")
        if state != "inProgress":
            self._downloading.discard(guid)  # completed or cancelled
            if state == "canceled" and guid in self._cancelled:
                # Chromium removes a cancelled download's file, but one
                # cancelled as it began can write its file after our removal
                # (a `.crdownload` was seen left): removed again once it landed.
                _remove_download(policy.downloads_dir, guid)
            return
        received = int(event.get("receivedBytes") or 0)
        if received > policy.max_download_bytes:
            self._cancel_download(guid, f"it passed {policy.max_download_bytes} bytes (the cap)")

    def _cancel_download(self, guid: str, why: str) -> None:
        policy = self.policy
        # Chromium names the file by the guid: a plain name, or nothing is touched.
        # Progress goes on arriving until the cancel lands: one cancel each.
        if (
            policy is None
            or policy.downloads_dir is None
            or self._cdp is None
            or not _GUID.fullmatch(guid)
            or guid in self._cancelled
        ):
            return
        self._downloading.discard(guid)
        self._cancelled.add(guid)
        self.downloads_cancelled += 1
        log.warning("a page's download was cancelled and removed: %s", why)
        task = asyncio.ensure_future(_cancel(self._cdp, guid, policy.downloads_dir))
        self._cancels.add(task)
        task.add_done_callback(self._cancels.discard)

    async def settle(self) -> None:
        """A task's end, its browser kept: what its page still downloads is
        cancelled and the folder emptied, so no download outlives the task
        that started it, nor adds up over the tasks a kept browser runs."""
        policy = self.policy
        if policy is None or policy.downloads_dir is None:
            return
        self._between_tasks = True
        for guid in list(self._downloading):
            self._cancel_download(guid, "its task has ended")
        if self._cancels:
            # A hung browser must not hold the task's result: what is left
            # ends with the browser, and its next start empties the folder.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(SETTLE_S):
                    await asyncio.gather(*self._cancels, return_exceptions=True)
        self._downloads_begun = 0
        with contextlib.suppress(OSError):
            for entry in policy.downloads_dir.iterdir():
                if entry.is_symlink() or not entry.is_dir():
                    entry.unlink()


async def _cancel(cdp: CDPSession, guid: str, where: Path) -> None:
    with contextlib.suppress(PlaywrightError):
        await cdp.send("Browser.cancelDownload", {"guid": guid})
    # allowAndName names the file by its guid; Chromium removes a cancelled
    # one itself, this covers a download that finished meanwhile.
    _remove_download(where, guid)


def _remove_download(where: Path, guid: str) -> None:
    """A download's file, finished or not (`guid` is checked to be a plain name)."""
    for path in (where / guid, where / f"{guid}.crdownload"):
        with contextlib.suppress(OSError):
            path.unlink()


async def install_guard(session: BrowserSession, policy: BrowserPolicy) -> None:
    """A task run's guard on a new browser; if it cannot be set, the browser is killed."""
    try:
        session.guard = Guard(session)
        await session.guard.apply(policy)
    except BaseException as exc:
        await session.abort()
        if isinstance(exc, PlaywrightError):
            raise TransientError(
                f"cannot set the browser's limits: {exc.message}", kind="browser_start"
            ) from exc
        raise


def clear_downloads(user_data_dir: Path) -> None:
    """What a previous browser left in the account's downloads dir."""
    shutil.rmtree(downloads_dir_for(user_data_dir), ignore_errors=True)
