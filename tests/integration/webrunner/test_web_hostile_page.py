"""The web runner against a hostile page (`demo.hostile`), with a real Chromium.

The page sets a session cookie and answers with media it chooses: on a host
no profile names, on an allowlisted host at another port, behind a redirect
off the allowlist, or never ending. Three hostile servers play the page's
site (A), an allowlisted vendor (B, named by an API profile) and a foreign
host (C, named by nothing).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import pytest_asyncio
from playwright.async_api import Page

from demo.hostile import SESSION_COOKIE, start_hostile
from dispatcher.errors import HostNotAllowed, PermanentError
from dispatcher.models import Kind, Task, new_id
from dispatcher.profiles import Profile
from dispatcher.service.serving import RunningServer
from tests.support.helpers import result_files
from webrunner.browser import BrowserSession
from webrunner.guard import downloads_dir_for, own_page
from webrunner.looks import MAX_MEDIA
from webrunner.runner import WebRunner

if TYPE_CHECKING:
    from tests.integration.webrunner.conftest import WebEnv

pytestmark = [pytest.mark.browser, pytest.mark.asyncio(loop_scope="session")]

MAX_DOWNLOAD_BYTES = 256 * 1024


@dataclass
class Sites:
    page: RunningServer  # A: the hostile page's own site
    other: RunningServer  # B: allowlisted (an API profile names it), another port
    foreign: RunningServer  # C: named by no profile

    async def stats(self, server: RunningServer) -> dict[str, Any]:
        async with httpx.AsyncClient() as http:
            data: dict[str, Any] = (await http.get(f"{server.url}/__stats")).json()
        return data

    async def show(self, *media: str, **extras: Any) -> None:
        async with httpx.AsyncClient() as http:
            answer = await http.post(
                f"{self.page.url}/__config",
                json={"media": list(media), "elsewhere": self.foreign.url, **extras},
            )
            answer.raise_for_status()


@pytest_asyncio.fixture(loop_scope="session")
async def sites() -> AsyncIterator[Sites]:
    servers = [await start_hostile() for _ in range(3)]
    try:
        yield Sites(*servers)
    finally:
        for server in servers:
            await server.stop()


def _profiles(sites: Sites, **web: Any) -> dict[str, Profile]:
    page = Profile.model_validate(
        {
            "name": "hostile-page",
            "kind": "web",
            "accounts": ["demo-1"],
            "web": {
                "url": f"{sites.page.url}/page",
                "logged_in": "#composer",
                "input": "#composer textarea",
                "submit": "#send",
                "answer": ".msg.assistant >> nth=-1",
                "done": ".msg.assistant[data-done] >> nth=-1",
                "stable_ms": 500,
                "media": "img.result, video.result",
                "max_download_bytes": MAX_DOWNLOAD_BYTES,
                **web,
            },
        }
    )
    vendor = Profile.model_validate(
        {
            "name": "other-api",
            "kind": "api",
            "provider": "other",
            "api": {
                "base_url": sites.other.url,
                "submit": {"method": "POST", "path": "/chat"},
                "result": {"text": "text"},
            },
        }
    )
    return {page.name: page, vendor.name: vendor}


async def _runner(web: WebEnv, sites: Sites, keep_alive_s: float = 0.0, **spec: Any) -> WebRunner:
    web.profiles = _profiles(sites, **spec)  # what `web.context` hands the runner, too
    settings = web.settings.model_copy(update={"browser_keep_alive_s": keep_alive_s})
    runner = WebRunner(settings, web.profiles, web.clock, playwright=web.driver)
    web.runners.append(runner)
    await runner.start()
    return runner


async def _refused(web: WebEnv, sites: Sites, *media: str) -> tuple[PermanentError, list[str]]:
    """A task on the page showing `media` fails for good: its error, and the
    result files it left."""
    await sites.show(*media)
    runner = await _runner(web, sites)
    task = _task()
    ctx = web.context(task)[0]
    with pytest.raises(PermanentError) as caught:
        await runner.run(task, ctx)
    return caught.value, result_files(ctx.result_dir)


def _task() -> Task:
    task_id = new_id()
    return Task(
        id=task_id,
        model="hostile-page",
        kind=Kind.WEB,
        queue="web:hostile-page",
        params={"prompt": "show me"},
        fingerprint=f"fp-{task_id}",
        created_at=0.0,
    )


async def test_cookies_go_to_the_page_origin_only_not_to_another_port(
    web: WebEnv, sites: Sites
) -> None:
    await sites.show("/media/ok.png", f"{sites.other.url}/there.png")
    runner = await _runner(web, sites)
    task = _task()
    result = await runner.run(task, web.context(task)[0])

    assert result.text == "here you go"
    assert [f.name for f in result.files] == ["00-ok.png", "01-there.png"]
    assert all(Path(f.path).read_bytes().startswith(b"\x89PNG") for f in result.files)
    (own,) = [
        r for r in (await sites.stats(sites.page))["requests"] if r["path"] == "/media/ok.png"
    ]
    assert SESSION_COOKIE in own["headers"].get("cookie", "")  # the control
    (there,) = (await sites.stats(sites.other))["requests"]
    # Same host, another port: cookies do not isolate ports, so we must.
    assert "cookie" not in there["headers"]
    assert there["headers"]["referer"] == f"{sites.page.url}/"


@pytest.mark.parametrize("where", ["on the foreign host", "behind a redirect to it"])
async def test_media_off_the_allowlist_is_refused_and_nothing_reaches_it(
    web: WebEnv, sites: Sites, where: str
) -> None:
    src = f"{sites.foreign.url}/steal.png" if where == "on the foreign host" else "/media/hop.png"
    error, left = await _refused(web, sites, src)
    assert isinstance(error, HostNotAllowed) and error.kind == "allowlist"
    assert f"127.0.0.1:{sites.foreign.port}" in str(error)
    assert (await sites.stats(sites.foreign))["request_count"] == 0
    assert left == []


async def test_an_endless_media_file_stops_at_the_cap(web: WebEnv, sites: Sites) -> None:
    error, left = await _refused(web, sites, "/endless/jobs/x/content")
    assert error.kind == "too_large"
    assert left == []  # the partial file is gone


async def test_an_answer_showing_more_media_than_the_cap_downloads_none(
    web: WebEnv, sites: Sites
) -> None:
    many = [f"{sites.page.url}/many/{i}.png" for i in range(MAX_MEDIA + 1)]
    error, left = await _refused(web, sites, *many)
    assert error.kind == "too_large"
    assert f"shows {MAX_MEDIA + 1} media elements" in str(error)
    stats = await sites.stats(sites.page)
    assert not [r for r in stats["requests"] if r["path"].startswith("/many/")]
    assert left == []


async def _until(what: str, check: Callable[[], Awaitable[bool]], within_s: float = 60.0) -> None:
    deadline = time.monotonic() + within_s
    while not await check():
        assert time.monotonic() < deadline, f"not within {within_s:.0f} s: {what}"
        await asyncio.sleep(0.05)


async def _download_ended(sites: Sites) -> bool:
    stats = await sites.stats(sites.page)
    asked = any(r["path"].startswith("/attachment/") for r in stats["requests"])
    return asked and stats["open_streams"] == 0


def _kept(runner: WebRunner) -> BrowserSession:
    session = runner.keeper.session("demo-1")
    assert session is not None and session.usable
    return session


async def test_a_download_the_page_starts_is_denied_while_the_browser_lives_on(
    web: WebEnv, sites: Sites
) -> None:
    await sites.show(download=f"{sites.page.url}/attachment/jobs/x/content")
    runner = await _runner(web, sites, keep_alive_s=600.0)
    task = _task()
    result = await runner.run(task, web.context(task)[0])
    assert result.text == "here you go"
    _kept(runner)  # the browser stays: nothing else would end the download

    await _until("the endless attachment stops", lambda: _download_ended(sites))
    served = (await sites.stats(sites.page))["bytes_served"]
    assert served < 64 * 1024 * 1024
    assert not downloads_dir_for(web.user_data_dir()).exists()  # nothing written anywhere of ours


async def test_a_download_the_profile_asks_for_stops_at_the_cap_and_is_removed(
    web: WebEnv, sites: Sites
) -> None:
    await sites.show(download=f"{sites.page.url}/attachment/jobs/x/content")
    runner = await _runner(web, sites, keep_alive_s=600.0, downloads=True)
    task = _task()
    result = await runner.run(task, web.context(task)[0])
    assert result.text == "here you go"
    session = _kept(runner)

    await _until("the endless attachment is cancelled", lambda: _download_ended(sites))
    target = downloads_dir_for(web.user_data_dir())
    assert target.is_dir() and target.is_relative_to(web.state_dir)

    async def removed() -> bool:
        return not list(target.iterdir())

    await _until("the partial download is removed", removed)
    assert session.guard is not None and session.guard.downloads_cancelled == 1


async def test_popups_are_closed_and_allow_hosts_keeps_the_browser_to_listed_hosts(
    web: WebEnv, sites: Sites
) -> None:
    foreign = sites.foreign.url
    await sites.show(
        images=[f"{foreign}/img.png", f"{sites.other.url}/listed.png"],
        popups=[f"{foreign}/popup-{i}" for i in range(20)],
    )
    runner = await _runner(
        web, sites, keep_alive_s=600.0, allow_hosts=[f"127.0.0.1:{sites.other.port}"]
    )
    task = _task()
    result = await runner.run(task, web.context(task)[0])
    assert result.text == "here you go"
    session = _kept(runner)

    guard = session.guard
    assert guard is not None

    async def popups_closed() -> bool:
        return guard.popups_closed == 20

    await _until("the 20 popups are closed", popups_closed)
    # What is left: the task's tab (and maybe a spare one for the next task).
    assert [p.url for p in session.context.pages if "popup" in p.url] == []

    async def listed_image_loaded() -> bool:
        return any(r["path"] == "/listed.png" for r in (await sites.stats(sites.other))["requests"])

    await _until("the listed host's image is loaded", listed_image_loaded)  # the control
    assert (await sites.stats(sites.foreign))["request_count"] == 0
    assert any(url.startswith(foreign) for url in guard.blocked)


async def test_a_popup_whose_opener_closed_first_is_closed_and_our_tabs_are_kept(
    web: WebEnv, sites: Sites, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A page's popups can reach us after their opener tab is gone (a task's
    tab is closed after its answer; on a busy machine the popups' events come
    later): they have no opener any more, and are closed all the same. The
    tabs we open ourselves are never taken for popups."""
    runner = await _runner(web, sites, keep_alive_s=600.0)
    task = _task()
    assert (await runner.run(task, web.context(task)[0])).text == "here you go"
    session = _kept(runner)
    guard = session.guard
    assert guard is not None
    before = guard.popups_closed

    opener = await own_page(session.context)
    # Every look at a new page's opener waits until the opener tab is closed,
    # as it does on a busy machine where the "page" events come late.
    closed_opener = asyncio.Event()
    look_up = Page.opener

    async def late_opener(page: Page) -> Page | None:
        await closed_opener.wait()
        return await look_up(page)

    monkeypatch.setattr(Page, "opener", late_opener)
    popup_urls = [f"{sites.foreign.url}/late-{i}" for i in range(3)]
    script = "".join(f"window.open({url!r}, '_blank');" for url in popup_urls)
    await opener.evaluate(f"() => {{ {script} }}")
    ours = await own_page(session.context)
    await opener.close()
    closed_opener.set()

    async def closed() -> bool:
        return guard.popups_closed - before == len(popup_urls)

    await _until("the popups of a closed opener are closed", closed)
    assert not ours.is_closed()
    assert [p.url for p in session.context.pages if "/late-" in p.url] == []


async def test_a_page_s_downloads_are_bounded_in_number_and_end_with_their_task(
    web: WebEnv, sites: Sites
) -> None:
    """Each download under the size cap, a page could still start one after
    another, or one that never ends, for as long as the browser is kept:
    at most `MAX_DOWNLOADS_AT_ONCE` run, and a task's end cancels the rest."""
    await sites.show(download=f"{sites.page.url}/dripfile/jobs/x/content", download_times=6)
    # A cap no drip reaches within the test: the size cap is not what ends them.
    runner = await _runner(
        web, sites, keep_alive_s=600.0, downloads=True, max_download_bytes=1024**3
    )
    task = _task()
    assert (await runner.run(task, web.context(task)[0])).text == "here you go"
    session = _kept(runner)
    guard = session.guard
    assert guard is not None

    async def all_began() -> bool:
        asked = [
            r
            for r in (await sites.stats(sites.page))["requests"]
            if r["path"].startswith("/dripfile/")
        ]
        return len(asked) >= 6

    await _until("the page's six downloads are asked for", all_began)
    assert _kept(runner) is session  # its browser open for the next task

    async def none_left() -> bool:
        return bool((await sites.stats(sites.page))["open_streams"] == 0)

    await _until("no download outlives its task", none_left)
    # Each as it began (past 4 at once, or after the task) or as the task ended.
    assert guard.downloads_cancelled == 6
    target = downloads_dir_for(web.user_data_dir())

    async def no_file_left() -> bool:
        # Chromium's word that a cancel landed can follow the stream's close.
        return not any(target.iterdir())

    await _until("no downloaded file outlives its task", no_file_left, within_s=10.0)
