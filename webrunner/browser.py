"""An account's Chromium: launched by us, driven over CDP, always ended by us.

We start Chromium ourselves (rather than letting Playwright launch it) so
that we know its PID and process group, can run the self-check on exactly
the flags we passed, and can kill it with its children when a page freezes
and Playwright stops answering. Playwright only connects to it over CDP,
through a pipe only this process holds (`cdppipe.py`): no debugging port.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil
from playwright.async_api import Browser, BrowserContext, Page, Playwright
from playwright.async_api import Error as PlaywrightError

from dispatcher.errors import PermanentError, TransientError
from webrunner.browserkill import BrowserRecord, family_of, kill_tree
from webrunner.cdppipe import EXIT_POLL_S, BrowserExited, CdpPipe, until_exit
from webrunner.selfcheck import KILL_AFTER_S, SelfCheckReport, self_check

if TYPE_CHECKING:
    from webrunner.guard import Guard

Log = logging.Logger | logging.LoggerAdapter[Any]

# DevTools over descriptors 3 and 4 (see cdppipe.py), never a TCP port.
DEBUGGING_PIPE_FLAG = "--remote-debugging-pipe"
STARTUP_TIMEOUT_S = 30.0
# How long a browser whose pipe broke during the connect may take to exit.
EXIT_WAIT_S = 1.0
# Real seconds an interrupted CDP connect gets to finish before the kill.
CONNECT_SETTLE_S = 10.0
# The first tab's page when a caller names none.
BLANK = "about:blank"

# Features that phone home, nag, or change behaviour between runs (the
# network is closed and runs must be alike), or cost CPU on every task.
_DISABLED_FEATURES = ",".join(
    (
        "AvoidUnnecessaryBeforeUnloadCheckSync",
        "DestroyProfileOnBrowserClose",  # would drop the logged-in session
        "HttpsUpgrades",
        "HttpsFirstBalancedModeAutoEnable",
        "LensOverlay",
        "MediaRouter",
        "OptimizationHints",
        "NetworkTimeServiceQuerying",
        "AimEnabled",
        "PreconnectToSearch",
        "Translate",
        "AutofillServerCommunication",
        "CertificateTransparencyComponentUpdater",
        # A new renderer-side frame for every load of a page, even of the
        # same site: each task loads its page afresh, and reusing the frame
        # costs ~20 ms less CPU a load (2-core VM, 2026-12-04).
        "RenderDocument",
    )
)

BASE_FLAGS: tuple[str, ...] = (
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-breakpad",
    "--disable-default-apps",
    "--disable-extensions",
    "--disable-component-extensions-with-background-pages",
    "--disable-field-trial-config",
    "--disable-search-engine-choice-screen",
    "--metrics-recording-only",
    "--no-service-autorun",
    "--disable-dev-shm-usage",
    "--mute-audio",
    # A headless tab is never "visible"; without these its timers and
    # streaming would be throttled as if it were in the background.
    "--disable-background-timer-throttling",
    "--disable-backgrounding-occluded-windows",
    "--disable-renderer-backgrounding",
    # The frozen-renderer case is handled by us (beats stop, then a kill);
    # Chromium's own hang dialog would only get in the way.
    "--disable-hang-monitor",
    "--disable-popup-blocking",
    "--disable-prompt-on-repost",
    # Cookies are encrypted with a fixed key instead of a desktop keyring
    # (there is none on a server), so a session survives between runs.
    "--password-store=basic",
    "--window-size=1280,900",
    f"--disable-features={_DISABLED_FEATURES}",
)


def chromium_flags(user_data_dir: Path, *, headless: bool = True) -> list[str]:
    flags = list(BASE_FLAGS)
    if headless:
        flags.append("--headless")
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        # Chromium's sandbox refuses to run as root.
        flags.append("--no-sandbox")
    flags += [f"--user-data-dir={user_data_dir}", DEBUGGING_PIPE_FLAG]
    return flags


def ensure_user_data_dir(path: Path) -> None:
    """Create the profile dir (0700) or check the existing one; never replace it."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        path.mkdir(exist_ok=True, mode=0o700)
    except FileExistsError as exc:
        raise PermanentError(
            f"browser profile {path} exists but is not a directory; move it away",
            kind="profile_dir",
        ) from exc
    except OSError as exc:
        raise PermanentError(
            f"cannot create browser profile {path}: {exc.strerror}", kind="profile_dir"
        ) from exc
    if path.is_symlink() or not path.is_dir():
        raise PermanentError(
            f"browser profile {path} is not a plain directory; move it away", kind="profile_dir"
        )
    st = path.stat()
    if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
        raise PermanentError(
            f"browser profile {path} belongs to uid {st.st_uid}, not to us", kind="profile_dir"
        )
    if st.st_mode & 0o077:
        # It holds a logged-in session: nobody else on the machine may read it.
        path.chmod(0o700)
    if not os.access(path, os.R_OK | os.W_OK | os.X_OK):
        raise PermanentError(f"browser profile {path} is not writable", kind="profile_dir")


def stderr_log_path(user_data_dir: Path) -> Path:
    return user_data_dir.parent / f"{user_data_dir.name}.chromium.log"


@dataclass
class BrowserSession:
    """A running Chromium we launched, and Playwright's connection to it."""

    process: subprocess.Popen[bytes]
    user_data_dir: Path
    pipe: CdpPipe
    browser: Browser
    context: BrowserContext
    selfcheck: SelfCheckReport
    timings_ms: dict[str, float] = field(default_factory=dict)
    survivors: list[int] = field(default_factory=list)  # not dead after the kill (never seen)
    # What Chromium's first tab was told to open at launch (see `start_browser`).
    start_url: str = BLANK
    # A task run's limits on popups, hosts and downloads (guard.py); None
    # for an operator's login, which may need a sign-in popup.
    guard: Guard | None = None
    _closed: bool = False

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    @property
    def usable(self) -> bool:
        """Running and still connected: fit for another task."""
        return not self._closed and self.alive and self.browser.is_connected()

    async def page(self) -> Page:
        """The tab Chromium opened at start (on `start_url`), or a new one."""
        from webrunner.guard import own_page  # guard.py types its sessions with ours

        pages = self.context.pages
        return pages[0] if pages else await own_page(self.context)

    def _group(self) -> list[psutil.Process]:
        return family_of(self.process)

    async def _kill(self, family: list[psutil.Process]) -> None:
        """Kill the browser and `family`, confirmed dead; the session is closed after it."""
        try:
            self.survivors = await kill_tree(self.process, self.user_data_dir, None, family)
        finally:
            self._closed = True

    async def close(self, log: Log | None = None, *, grace_s: float = KILL_AFTER_S) -> bool:
        """Close gracefully, kill with children after `grace_s`; True if it exited by itself.

        Returns only once the process is confirmed dead.
        """
        if self._closed:
            return True
        started = time.monotonic()
        graceful = False
        # Known before the close: once the browser exits, its renderers and
        # zygotes are orphans whose command lines may already be blank.
        family = self._group()
        try:
            asked = self.alive and await self._ask_to_close()
            if not asked and self.alive:
                with contextlib.suppress(OSError):
                    os.kill(self.pid, signal.SIGTERM)
            # No SIGTERM once Browser.close is under way: it would cut short
            # the shutdown that writes the session cookie to disk.
            graceful = await self._wait_exit(started + grace_s)
            if not graceful and log is not None:
                log.warning(
                    "browser pid %d did not exit %.0f s after close; killing it and its children",
                    self.pid,
                    grace_s,
                )
        finally:
            # Also on cancellation: whatever happened above, nothing may survive.
            await self._kill(family)
            await self._disconnect()
        self.timings_ms["close"] = (time.monotonic() - started) * 1000
        return graceful

    async def _ask_to_close(self) -> bool:
        """Send CDP Browser.close; True if the browser took the request."""
        if not self.browser.is_connected():
            return False
        # Browser.close lets Chromium flush cookies and the profile to disk;
        # it runs in the browser process, so a frozen tab does not block it.
        try:
            cdp = await asyncio.wait_for(self.browser.new_browser_cdp_session(), 1.0)
        except (PlaywrightError, TimeoutError):
            return False
        try:
            await asyncio.wait_for(cdp.send("Browser.close"), 1.0)
        except TimeoutError:
            return False
        except PlaywrightError:
            # The connection may drop before the reply: that is the close.
            pass
        return True

    async def _wait_exit(self, until: float) -> bool:
        while time.monotonic() < until:
            if not self.alive:
                return True
            await asyncio.sleep(0.02)
        return not self.alive

    async def abort(self) -> None:
        """Kill at once (the task was cancelled or the page froze); confirmed dead."""
        if self._closed:
            return
        await self._kill(self._group())
        await self._disconnect()

    async def _disconnect(self) -> None:
        # The process is dead, so this only releases Playwright's side; bounded
        # anyway because it runs in cleanup paths.
        with contextlib.suppress(PlaywrightError, asyncio.TimeoutError):
            await asyncio.wait_for(self.browser.close(), 2.0)
        await self.pipe.close()


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def _last_lines(text: str, n: int = 5) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return " | ".join(lines[-n:])[-800:]


def _spawn(
    executable: str, user_data_dir: Path, headless: bool, start_url: str = BLANK
) -> tuple[subprocess.Popen[bytes], CdpPipe]:
    """Start Chromium with its DevTools on a pipe; (process, pipe)."""
    argv = [executable, *chromium_flags(user_data_dir, headless=headless)]
    pipe = CdpPipe()
    try:
        proc = _popen(argv, stderr_log_path(user_data_dir), pipe, start_url)
    except BaseException:
        pipe.discard()
        raise
    pipe.spawned()
    return proc, pipe


def _popen(
    argv: list[str], log_path: Path, pipe: CdpPipe, start_url: str = BLANK
) -> subprocess.Popen[bytes]:
    with open(log_path, "wb") as stderr:
        return subprocess.Popen(
            [*argv, start_url],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            # Its own session and process group: signals to the dispatcher's
            # terminal do not reach it, and killpg reaches all of it.
            start_new_session=True,
            # `child_setup` closes what close_fds would, but keeps 3 and 4.
            close_fds=False,
            preexec_fn=pipe.child_setup,
        )


def _start_failure(
    proc: subprocess.Popen[bytes], user_data_dir: Path, exited: bool, why: str
) -> TransientError:
    """Why a launch failed, in the browser's own words when it exited by itself."""
    log_path = stderr_log_path(user_data_dir)
    text = _read_text(log_path)
    if exited:
        return TransientError(
            f"Chromium exited with code {proc.returncode} while starting on profile "
            f"{user_data_dir}: {_last_lines(text) or 'no output'} (full log: {log_path})",
            kind="browser_start",
        )
    return TransientError(f"{why} (log: {log_path})", kind="browser_start")


async def start_browser(
    playwright: Playwright,
    *,
    executable: str,
    user_data_dir: Path,
    log: Log | None = None,
    start_url: str | None = None,
    headless: bool = True,
) -> BrowserSession:
    """Self-check, launch Chromium on the profile, connect Playwright over CDP.

    `start_url` (an http(s) URL): the page Chromium's first tab starts
    loading at launch, while Playwright connects (~0.2-0.9 s), instead of
    about:blank; the caller still checks what it shows.

    Interrupted at any step (a cancel, the start budget), it kills what it
    launched before passing the interrupt on.
    """
    # Only a web URL goes on the command line: anything else could read as a flag.
    first = start_url if start_url and start_url.startswith(("http://", "https://")) else BLANK
    t0 = time.monotonic()
    report = await _self_check(user_data_dir, log)
    t1 = time.monotonic()
    proc, pipe = await _launch(executable, user_data_dir, headless, first)
    t2 = time.monotonic()
    browser = await _connect(playwright, proc, user_data_dir, pipe)
    t3 = time.monotonic()
    session = BrowserSession(
        process=proc,
        user_data_dir=user_data_dir,
        pipe=pipe,
        browser=browser,
        context=browser.contexts[0],
        selfcheck=report,
        start_url=first,
        timings_ms={
            "selfcheck": (t1 - t0) * 1000,
            "launch": (t2 - t1) * 1000,
            "connect": (t3 - t2) * 1000,
        },
    )
    if log is not None:
        log.info(
            "browser pid %d (self-check %.0f ms, launch %.0f ms, connect %.0f ms)",
            proc.pid,
            *session.timings_ms.values(),
        )
    return session


async def _self_check(user_data_dir: Path, log: Log | None) -> SelfCheckReport:
    """End what a previous run left on the profile; refuse if any of it survived."""
    ensure_user_data_dir(user_data_dir)
    last = BrowserRecord.load(user_data_dir)
    report = await asyncio.to_thread(
        self_check,
        user_data_dir,
        port=last.port or None if last else None,
        pid=last.pid if last else None,
        create_time=last.create_time if last else None,
    )
    if log is not None:
        if report.clean:
            log.info("%s", report.summary())
        else:
            log.warning("%s", report.summary())
    if not report.ok:
        raise TransientError(
            f"leftover browser processes {report.survivors} of profile {user_data_dir} "
            "survived SIGKILL; not starting another browser on it",
            kind="browser_start",
        )
    return report


async def _launch(
    executable: str, user_data_dir: Path, headless: bool, start_url: str = BLANK
) -> tuple[subprocess.Popen[bytes], CdpPipe]:
    """Chromium on its pipe, recorded for the next self-check; (process, pipe)."""
    try:
        proc, pipe = _spawn(executable, user_data_dir, headless, start_url)
    except OSError as exc:
        raise TransientError(
            f"cannot start Chromium {executable}: {exc.strerror}", kind="browser_start"
        ) from exc
    try:
        create_time = psutil.Process(proc.pid).create_time()
    except psutil.Error:
        create_time = 0.0
    BrowserRecord(proc.pid, 0, create_time).save(user_data_dir)
    return proc, pipe


async def _settle(connect: asyncio.Future[Browser], proc: subprocess.Popen[bytes]) -> None:
    """Let an interrupted connect finish (or the browser exit) before the
    browser is killed, within `CONNECT_SETTLE_S`; then give it up."""
    deadline = time.monotonic() + CONNECT_SETTLE_S
    try:
        while not connect.done() and proc.poll() is None and time.monotonic() < deadline:
            await asyncio.wait({connect}, timeout=EXIT_POLL_S)
    except asyncio.CancelledError:
        # Cancelled again while settling: the kill follows at once.
        pass
    if not connect.done():
        connect.cancel()
        await asyncio.wait({connect}, timeout=EXIT_WAIT_S)
    if connect.done() and not connect.cancelled():
        connect.exception()  # retrieved: its failure is no news


async def _connect(
    playwright: Playwright,
    proc: subprocess.Popen[bytes],
    user_data_dir: Path,
    pipe: CdpPipe,
) -> Browser:
    """Playwright's connection to the launched browser; on any failure it is killed."""
    connect: asyncio.Future[Browser] | None = None
    try:
        ws_url = await pipe.open()
        # Chromium reads the pipe once it is up: the connect waits for that.
        # Shielded: a connect cancelled half-way leaves Playwright a browser
        # it never finished wiring, whose close event then crashes its
        # dispatcher (`'NoneType' object has no attribute '_contexts'`).
        connect = asyncio.ensure_future(
            playwright.chromium.connect_over_cdp(ws_url, timeout=STARTUP_TIMEOUT_S * 1000)
        )
        return await until_exit(proc, asyncio.shield(connect))
    except BaseException as exc:
        if connect is not None and not connect.done():
            await _settle(connect, proc)
        if isinstance(exc, PlaywrightError):
            # The pipe closed under the connect: most likely Chromium quit;
            # let it finish so that its exit code, not our kill, is reported.
            with contextlib.suppress(subprocess.TimeoutExpired):
                await asyncio.to_thread(proc.wait, EXIT_WAIT_S)
        exited = proc.poll() is not None
        await kill_tree(proc, user_data_dir, None)
        await pipe.close()
        if isinstance(exc, (PlaywrightError, OSError, BrowserExited)):
            # (The URL holds the relay's token: it stays out of the message.)
            why = exc.message if isinstance(exc, PlaywrightError) else str(exc)
            raise _start_failure(
                proc, user_data_dir, exited, f"cannot connect to Chromium over its pipe: {why}"
            ) from exc
        raise
