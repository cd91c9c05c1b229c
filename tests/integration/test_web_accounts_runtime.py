"""Web accounts added and removed while serving: real Chromium against the demo web model."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from demo.web_model import demo_login
from dispatcher.errors import LockHeld
from dispatcher.models import Account, Kind
from dispatcher.store import Store
from dispatcher.store.hosts import LeaseRefused
from tests.integration.test_web_lanes import account_browsers
from tests.support.harness import Harness, running_service
from tests.support.helpers import demo_chat_on
from tests.support.pgdb import migrated_database
from webrunner.lock import AccountLock
from webrunner.runner import WebRunner

pytestmark = [pytest.mark.browser, pytest.mark.timeout(120)]


LISTED = 'accounts = ["demo-1"]'


def one_listed(tmp_path: Path) -> None:
    """demo-chat lists one account (`LISTED`), which the test takes out of
    service: a browser fewer to start and stop than its usual two."""
    demo_chat_on(tmp_path, ("demo-1",))


async def only_extra_serving(h: Harness) -> WebRunner:
    """The listed account (`one_listed`) disabled, and "extra" logged in and
    added: the one account serving demo-chat."""
    runner = h.service.runners[Kind.WEB]
    assert isinstance(runner, WebRunner)
    disabled = await h.http.post("/v1/accounts/demo-1/disable", json={"reason": "not this one"})
    assert disabled.status_code == 200, disabled.text
    await demo_login(
        runner.browser_executable,
        runner.user_data_dir("extra"),
        f"{h.demo_web}/chat",
        playwright=runner.playwright,
    )
    added = await h.http.post("/v1/accounts", json={"name": "extra", "models": ["demo-chat"]})
    assert added.status_code == 201, added.text
    assert added.json()["models"] == ["demo-chat"]
    return runner


def held_removals(runner: WebRunner) -> tuple[asyncio.Event, asyncio.Event]:
    """The runner's removals held open as if their browser took its time to
    close: the first event is set once one is, the second lets them go on."""
    remove_account = runner.remove_account
    closing = asyncio.Event()
    go_on = asyncio.Event()

    async def slow_remove(account: str) -> None:
        closing.set()
        await go_on.wait()
        await remove_account(account)

    runner.remove_account = slow_remove  # type: ignore[method-assign]
    return closing, go_on


def held_first_read(store: Store) -> tuple[asyncio.Event, asyncio.Event]:
    """The store's next read of the added accounts held open after it has
    read (its picture goes stale meanwhile): the first event is set once it
    is, the second lets it return."""
    read = store.get_web_accounts
    reading = asyncio.Event()
    go_on = asyncio.Event()

    async def slow_first_read() -> dict[str, tuple[str, ...]]:
        got = await read()
        if not reading.is_set():
            reading.set()
            await go_on.wait()
        return got

    store.get_web_accounts = slow_first_read  # type: ignore[method-assign]
    return reading, go_on


async def test_an_added_account_serves_at_once_and_drains_when_removed(tmp_path: Path) -> None:
    one_listed(tmp_path)
    async with running_service(tmp_path, profiles=(), time_scale=0.05) as h:
        bad = [
            ({"name": "../etc", "models": ["demo-chat"]}, "name"),
            ({"name": "extra", "models": ["nope"]}, "not a loaded web model: nope"),
            ({"name": "extra", "models": []}, "models"),
        ]
        for body, why in bad:
            refused = await h.http.post("/v1/accounts", json=body)
            assert refused.status_code == 400 and why in refused.text, refused.text
        runner = await only_extra_serving(h)
        assert await h.service.store.get_web_accounts() == {"extra": ("demo-chat",)}
        lanes = {lane["name"]: lane for lane in (await h.http.get("/v1/lanes")).json()}
        assert lanes["web:extra"]["models"] == ["demo-chat"]
        task = await h.submit("demo-chat", "on the new account [duration=20]")
        running = await h.wait_task(task["id"], {"running"})
        assert running["owner"] == "extra"
        # Busy: refused without drain; with drain it takes no new task.
        refused = await h.http.delete("/v1/accounts/extra")
        assert refused.status_code == 409 and "--drain" not in refused.text
        assert "drain" in refused.json()["error"]["message"]
        listed = await h.http.delete("/v1/accounts/demo-1")
        assert listed.status_code == 409 and "demo-chat.toml" in listed.text
        draining = await h.http.delete("/v1/accounts/extra", params={"drain": "true"})
        assert draining.status_code == 202 and draining.json()["running"] == [task["id"]]
        names = [lane["name"] for lane in (await h.http.get("/v1/lanes")).json()]
        assert "web:extra" not in names
        done = await h.wait_task(task["id"])
        assert done["state"] == "success" and done["owner"] == "extra"
        # Gone once its task ended: no row, no browser, the lock free.
        # Its browser closes gracefully first (up to 3 s before a kill): wait
        # by the clock, not by a count of looks, which a loaded machine outruns.
        deadline = asyncio.get_running_loop().time() + 30.0
        while asyncio.get_running_loop().time() < deadline:
            accounts = [a["name"] for a in (await h.http.get("/v1/accounts")).json()]
            if "extra" not in accounts and not account_browsers(h.state_dir, "extra"):
                break
            await asyncio.sleep(0.05)
        assert "extra" not in accounts and not account_browsers(h.state_dir, "extra")
        assert await h.service.store.get_web_accounts() == {}
        lock = AccountLock(runner.locks_dir, "extra")
        try:
            lock.acquire()
        except LockHeld:
            pytest.fail("the removed account's lock is still held")
        lock.release()
        gone = await h.http.delete("/v1/accounts/extra")
        assert gone.status_code == 404
        # A profile that lists one more account: a reload takes it on.
        source = tmp_path / "profiles" / "demo-chat.toml"
        source.write_text(source.read_text().replace(LISTED, 'accounts = ["demo-1", "demo-3"]'))
        answer = (await h.http.post("/v1/reload")).json()
        assert answer["changed"] == ["demo-chat"] and answer["refused"] == {}
        lanes = {lane["name"]: lane for lane in (await h.http.get("/v1/lanes")).json()}
        assert lanes["web:demo-3"]["models"] == ["demo-chat"]
        assert "demo-3" in runner.accounts and runner.user_data_dir("demo-3").is_dir()


async def test_an_account_added_logged_out_can_be_logged_in_by_a_cookie_import(
    tmp_path: Path,
) -> None:
    """The usual order on a real vendor: add the account, then log it in. The
    login routes know a run-time account (and one a reload brings) as they
    know a listed one."""
    one_listed(tmp_path)
    async with running_service(tmp_path, profiles=(), time_scale=0.05) as h:
        await h.http.post("/v1/accounts/demo-1/disable", json={"reason": "not this one"})
        added = await h.http.post("/v1/accounts", json={"name": "extra", "models": ["demo-chat"]})
        assert added.status_code == 201, added.text
        async with httpx.AsyncClient() as client:
            login = await client.post(
                f"{h.demo_web}/login", data={"username": "extra", "password": "pw"}
            )
        cookie = login.cookies["demo_session"]
        host = httpx.URL(h.demo_web).host
        answer = await h.http.post(
            "/v1/accounts/extra/import",
            json={"text": f"{host}\tFALSE\t/\tFALSE\t0\tdemo_session\t{cookie}\n"},
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["logged_in"] is True
        task = await h.submit("demo-chat", "on the account imported after adding it")
        done = await h.wait_task(task["id"])
        assert done["state"] == "success" and done["owner"] == "extra"
        unknown = await h.http.post("/v1/accounts/nobody/import", json={"text": "x"})
        assert unknown.status_code == 404 and "no web account 'nobody'" in unknown.text


async def test_a_lane_rebuild_in_flight_does_not_reopen_an_account_removed_meanwhile(
    tmp_path: Path,
) -> None:
    """Lanes are rebuilt from several reads (profiles, added accounts,
    leases). One in flight when `accounts remove` lands (a lost lease, a
    reload) must not swap its older picture in after the removal's own."""
    async with running_service(tmp_path, profiles=("demo-chat",), time_scale=0.05) as h:
        added = await h.http.post("/v1/accounts", json={"name": "extra", "models": ["demo-chat"]})
        assert added.status_code == 201, added.text
        # The first read holds the picture that still has "extra".
        stale_read, go_on = held_first_read(h.service.store)
        rebuild = asyncio.create_task(h.service._relane())
        await stale_read.wait()
        removing = asyncio.create_task(h.http.delete("/v1/accounts/extra"))
        await asyncio.sleep(0.3)  # the removal is under way (or done, without the fix)
        go_on.set()
        await rebuild
        gone = await removing
        assert gone.status_code == 200, gone.text
        lanes = await h.http.get("/v1/lanes")
        assert lanes.status_code == 200, lanes.text
        assert "web:extra" not in [lane["name"] for lane in lanes.json()], lanes.text


async def test_an_account_with_an_open_login_session_is_not_removed_under_it(
    tmp_path: Path,
) -> None:
    """The login session holds the account's profile (its Chromium, its lock)
    for up to 15 minutes: `accounts remove` answers at once that it is open,
    rather than hanging behind it half done."""
    async with running_service(tmp_path, profiles=("demo-chat",), time_scale=0.05) as h:
        added = await h.http.post("/v1/accounts", json={"name": "extra", "models": ["demo-chat"]})
        assert added.status_code == 201, added.text
        opened = await h.http.post("/v1/accounts/extra/login")
        assert opened.status_code == 201, opened.text
        refused = await asyncio.wait_for(h.http.delete("/v1/accounts/extra"), 10)
        assert refused.status_code == 409, refused.text
        assert "login session" in refused.json()["error"]["message"]
        lanes = [lane["name"] for lane in (await h.http.get("/v1/lanes")).json()]
        assert "web:extra" in lanes  # nothing of the removal was done
        closed = await h.http.post("/v1/accounts/extra/login/cancel")
        assert closed.status_code == 200, closed.text
        gone = await h.http.delete("/v1/accounts/extra")
        assert gone.status_code == 200, gone.text
        assert not account_browsers(h.state_dir, "extra")


async def test_an_add_landing_during_a_removal_keeps_the_account(tmp_path: Path) -> None:
    """A removal closes the account's browser (gracefully: seconds) before it
    lets the lock and the row go. An `accounts add` of the same name answered
    meanwhile must leave the account served, locked and listed, not have the
    removal's end take them away again."""
    async with running_service(tmp_path, profiles=("demo-chat",), time_scale=0.05) as h:
        runner = h.service.runners[Kind.WEB]
        assert isinstance(runner, WebRunner)
        added = await h.http.post("/v1/accounts", json={"name": "extra", "models": ["demo-chat"]})
        assert added.status_code == 201, added.text
        closing, go_on = held_removals(runner)
        removing = asyncio.create_task(h.http.delete("/v1/accounts/extra"))
        await closing.wait()
        adding = asyncio.create_task(
            h.http.post("/v1/accounts", json={"name": "extra", "models": ["demo-chat"]})
        )
        await asyncio.sleep(0.3)  # the add is under way (or answered, without the fix)
        go_on.set()
        assert (await removing).status_code == 200
        readded = await adding
        assert readded.status_code == 201, readded.text
        assert await h.service.store.get_web_accounts() == {"extra": ("demo-chat",)}
        accounts = [a["name"] for a in (await h.http.get("/v1/accounts")).json()]
        assert "extra" in accounts
        lock = AccountLock(runner.locks_dir, "extra")
        with pytest.raises(LockHeld):
            lock.acquire()
        assert "extra" in runner.accounts


async def test_a_login_finishing_as_its_account_is_removed_leaves_no_ghost_row(
    tmp_path: Path,
) -> None:
    """A cookie import (or a login's Done) enables the account once its
    browser has closed; on PostgreSQL that write takes a round trip. An
    `accounts remove` landing during it must not see the account come back:
    listed by GET /v1/accounts, its row in the database, with no lane and
    nothing that removes it any more."""
    with migrated_database() as url:
        async with running_service(
            tmp_path, profiles=("demo-chat",), time_scale=0.05, database_url=url
        ) as h:
            added = await h.http.post(
                "/v1/accounts", json={"name": "extra", "models": ["demo-chat"]}
            )
            assert added.status_code == 201, added.text
            await h.browsers_started()  # its login wall is met (needs attention) first
            store = h.service.store
            upsert = store.upsert_account
            writing = asyncio.Event()
            go_on = asyncio.Event()

            async def slow_enable(account: Account) -> None:
                if account.name == "extra" and account.enabled and not account.needs_attention:
                    writing.set()
                    await go_on.wait()
                await upsert(account)

            store.upsert_account = slow_enable  # type: ignore[method-assign]
            async with httpx.AsyncClient() as client:
                login = await client.post(
                    f"{h.demo_web}/login", data={"username": "extra", "password": "pw"}
                )
            host = httpx.URL(h.demo_web).host
            cookie = login.cookies["demo_session"]
            importing = asyncio.create_task(
                h.http.post(
                    "/v1/accounts/extra/import",
                    json={"text": f"{host}\tFALSE\t/\tFALSE\t0\tdemo_session\t{cookie}\n"},
                )
            )
            await writing.wait()
            removing = asyncio.create_task(h.http.delete("/v1/accounts/extra"))
            await asyncio.sleep(0.3)  # the removal is under way (or done, without the fix)
            go_on.set()
            removed = await removing
            assert removed.status_code == 200, removed.text
            imported = await importing
            assert imported.status_code == 200, imported.text  # it was under way first
            accounts = [a["name"] for a in (await h.http.get("/v1/accounts")).json()]
            assert "extra" not in accounts
            assert "extra" not in await store.get_accounts()


async def test_a_reload_listing_a_draining_account_keeps_it(tmp_path: Path) -> None:
    """An added account moved into a profile: `accounts remove --drain`, the
    profile edited to list it, a reload. The reload takes it on (its lane
    serves again); the drain ending later must not then release its lock
    and forget its row under the profile that lists it."""
    one_listed(tmp_path)
    async with running_service(tmp_path, profiles=(), time_scale=0.05) as h:
        await only_extra_serving(h)
        task = await h.submit("demo-chat", "before the move [duration=20]")
        await h.wait_task(task["id"], {"running"})
        draining = await h.http.delete("/v1/accounts/extra", params={"drain": "true"})
        assert draining.status_code == 202, draining.text
        source = tmp_path / "profiles" / "demo-chat.toml"
        source.write_text(source.read_text().replace(LISTED, 'accounts = ["demo-1", "extra"]'))
        answer = (await h.http.post("/v1/reload")).json()
        assert answer["changed"] == ["demo-chat"] and answer["refused"] == {}, answer
        first = await h.wait_task(task["id"])
        assert first["state"] == "success", first["attempts"]
        roster = h.service.roster
        deadline = asyncio.get_running_loop().time() + 30.0
        while roster._draining:
            assert asyncio.get_running_loop().time() < deadline, "the drain never ended"
            await asyncio.sleep(0.05)
        accounts = [a["name"] for a in (await h.http.get("/v1/accounts")).json()]
        assert "extra" in accounts
        lanes = [lane["name"] for lane in (await h.http.get("/v1/lanes")).json()]
        assert "web:extra" in lanes
        after = await h.submit("demo-chat", "after the move")
        done = await h.wait_task(after["id"])
        assert done["state"] == "success" and done["owner"] == "extra", done["attempts"][0]["error"]


async def test_a_reload_during_a_removal_that_lists_the_account_keeps_it(tmp_path: Path) -> None:
    """The same move without drain: a reload that lists the account lands
    while its removal closes its browser. Whichever goes first, the account
    ends served by the profile: locked, listed, running its tasks."""
    one_listed(tmp_path)
    async with running_service(tmp_path, profiles=(), time_scale=0.05) as h:
        runner = await only_extra_serving(h)
        closing, go_on = held_removals(runner)
        removing = asyncio.create_task(h.http.delete("/v1/accounts/extra"))
        await closing.wait()
        source = tmp_path / "profiles" / "demo-chat.toml"
        source.write_text(source.read_text().replace(LISTED, 'accounts = ["demo-1", "extra"]'))
        reloading = asyncio.create_task(h.http.post("/v1/reload"))
        await asyncio.sleep(0.3)  # the reload is under way (or done, without the fix)
        go_on.set()
        assert (await removing).status_code == 200
        answer = (await reloading).json()
        assert answer["changed"] == ["demo-chat"] and answer["refused"] == {}, answer
        accounts = [a["name"] for a in (await h.http.get("/v1/accounts")).json()]
        assert "extra" in accounts
        task = await h.submit("demo-chat", "after the move")
        done = await h.wait_task(task["id"])
        assert done["state"] == "success" and done["owner"] == "extra", done["attempts"]


async def test_a_draining_account_takes_no_task_from_the_backlog(tmp_path: Path) -> None:
    """`accounts remove --drain` promises no new task: when its running one
    ends, the account must not take the next pending one (with a backlog
    the drain would never end)."""
    one_listed(tmp_path)
    async with running_service(tmp_path, profiles=(), time_scale=0.05) as h:
        await only_extra_serving(h)
        first = await h.submit("demo-chat", "the one running [duration=20]")
        await h.wait_task(first["id"], {"running"})
        backlog = [await h.submit("demo-chat", f"backlog {i} [duration=20]") for i in range(2)]
        draining = await h.http.delete("/v1/accounts/extra", params={"drain": "true"})
        assert draining.status_code == 202, draining.text
        assert (await h.wait_task(first["id"]))["state"] == "success"
        deadline = asyncio.get_running_loop().time() + 30.0
        while h.service.roster._draining:
            assert asyncio.get_running_loop().time() < deadline, "the drain never ended"
            await asyncio.sleep(0.05)
        for task in backlog:
            waiting = await h.task(task["id"])
            assert waiting["state"] == "pending" and waiting["owner"] is None, waiting


async def test_two_adds_of_one_account_at_once_keep_both_models(tmp_path: Path) -> None:
    """Each add serves what was stored plus what it names; on PostgreSQL the
    read is a round trip, and two adds at once must not each write their own
    list over the other's (both answered 201, one model silently dropped)."""
    with migrated_database() as url:
        async with running_service(
            tmp_path, profiles=("demo-chat", "demo-reasoner"), time_scale=0.05, database_url=url
        ) as h:
            store = h.service.store
            # The first read holds the picture without the other add's model.
            reading, go_on = held_first_read(store)
            first = asyncio.create_task(
                h.http.post("/v1/accounts", json={"name": "extra", "models": ["demo-chat"]})
            )
            await reading.wait()
            second = asyncio.create_task(
                h.http.post("/v1/accounts", json={"name": "extra", "models": ["demo-reasoner"]})
            )
            await asyncio.sleep(0.3)  # the second add is under way (or done, without the fix)
            go_on.set()
            assert (await first).status_code == 201
            assert (await second).status_code == 201
            assert await store.get_web_accounts() == {"extra": ("demo-chat", "demo-reasoner")}


async def test_an_add_of_an_account_another_host_serves_is_refused_naming_it(
    tmp_path: Path,
) -> None:
    """On a shared database, an account whose lease another live host holds
    would only be listed as refused here: the add says so (409, naming the
    host) instead of answering 201 "added"."""
    with migrated_database() as url:
        async with running_service(
            tmp_path, profiles=("demo-chat",), time_scale=0.05, database_url=url
        ) as h:
            store = h.service.store
            now = h.service.clock.now()
            await store.register_host("host-b", now, None)
            held = await store.acquire_lease("extra", "host-b", now, 3600.0)
            assert not isinstance(held, LeaseRefused)
            added = await h.http.post(
                "/v1/accounts", json={"name": "extra", "models": ["demo-chat"]}
            )
            assert added.status_code == 409, added.text
            assert "served by host 'host-b'" in added.json()["error"]["message"]
            assert "extra" not in await store.get_web_accounts()
            # Released there, the same add works here.
            assert await store.release_lease(held)
            again = await h.http.post(
                "/v1/accounts", json={"name": "extra", "models": ["demo-chat"]}
            )
            assert again.status_code == 201, again.text


async def test_a_drained_account_s_running_task_starts_its_browser(tmp_path: Path) -> None:
    """A drain takes the account's models off the lanes at once, while its
    running task may not have started its browser yet: that start must still
    find the model's page (it failed "no web account 'extra'" on a CI run, a
    crashed attempt charged to a task nobody cancelled)."""
    one_listed(tmp_path)
    async with running_service(tmp_path, profiles=(), time_scale=0.05, browser_prewarm=False) as h:
        runner = await only_extra_serving(h)
        make_room = runner.memory.make_room
        held = asyncio.Event()
        go_on = asyncio.Event()

        async def held_make_room(account: str, log: object, *, for_task: bool = True) -> bool:
            held.set()
            await go_on.wait()
            return await make_room(account, log, for_task=for_task)  # type: ignore[arg-type]

        runner.memory.make_room = held_make_room  # type: ignore[method-assign]
        first = await h.submit("demo-chat", "the one running [duration=5]")
        await asyncio.wait_for(held.wait(), 30)
        draining = await h.http.delete("/v1/accounts/extra", params={"drain": "true"})
        assert draining.status_code == 202, draining.text
        go_on.set()
        done = await h.wait_task(first["id"])
        assert done["state"] == "success" and len(done["attempts"]) == 1, done
