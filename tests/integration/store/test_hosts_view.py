"""Several hosts on one database seen as one: every host lists them all.

Two services on one fresh PostgreSQL database (and a third host that only
registered and leased a web account, as a host with browsers does): each
host's `GET /v1/hosts` and `dispatcher hosts` name every host with its
address, last beat, leased accounts and running tasks, and a host that
stopped shows as dead. A task that ran on the other host names that host,
and its result files are said to be there rather than offered as a link
this host answers with a 409.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from pathlib import Path
from typing import Any

import pytest

from dispatcher.store import Store, open_store
from tests.support.harness import Harness, host_service, running_service
from tests.support.helpers import REPO
from tests.support.pgdb import migrated_database
from tests.support.servicecli import clean_env, run_cli

pytestmark = pytest.mark.timeout(120)

SCALE = 0.2  # beats every 3 s, stale after 18 s


async def hosts_of(h: Harness) -> dict[str, dict[str, Any]]:
    response = await h.http.get("/v1/hosts")
    assert response.status_code == 200, response.text
    return {host["host"]: host for host in response.json()}


async def cli_hosts(h: Harness, *args: str, columns: int = 200) -> Any:
    env = clean_env({"DISPATCHER_STATE_DIR": str(h.state_dir), "COLUMNS": str(columns)})
    done = await asyncio.to_thread(run_cli, ["hosts", *args], env, REPO)
    assert done.returncode == 0, done.stderr
    return done.stdout


async def beating(store: Store, host: str) -> None:
    """Heartbeats as a live host sends them (every 5 s unscaled, here every 1 s)."""
    while True:
        await store.host_heartbeat(host, time.time())
        await asyncio.sleep(1.0)


async def test_every_host_lists_all_hosts_with_their_accounts_and_running_tasks(
    tmp_path: Path,
) -> None:
    with migrated_database() as url:
        # A third host that holds a web account's lease (its browsers are its
        # own). It beats like the others: registered once, it went silent past
        # the 18 s stale bound while a loaded machine ran the CLI, and was
        # declared dead with its lease.
        store = await open_store(url, "host-c")
        beat: asyncio.Task[None] | None = None
        try:
            await store.register_host("host-c", time.time(), "http://127.0.0.1:1")
            await store.acquire_lease("acct-on-c", "host-c", time.time(), 600.0)
            beat = asyncio.create_task(beating(store, "host-c"))
            async with host_service(tmp_path, "host-a", ("demo-chat-api",), url, SCALE) as a:
                b_service = host_service(tmp_path, "host-b", ("demo-video",), url, SCALE)
                b = await b_service.__aenter__()
                try:
                    slow = await b.submit("demo-video", "a slow pan", gen_s=600)
                    await b.wait_task(slow["id"], {"running"})
                    for h in (a, b):
                        seen = await hosts_of(h)
                        assert sorted(seen) == ["host-a", "host-b", "host-c"]
                        assert [n for n, x in seen.items() if x["this_host"]] == [
                            h.service.settings.host_id
                        ]
                        assert {x["state"] for x in seen.values()} == {"alive"}
                        assert seen["host-b"]["running"] == 1
                        assert seen["host-a"]["running"] == 0
                        assert seen["host-c"]["accounts"] == ["acct-on-c"]
                        assert seen["host-b"]["url"] == b.service.url
                        assert seen["host-a"]["url"] == a.service.url

                    # The CLI prints the same, from either host.
                    listed = json.loads(await cli_hosts(a, "--json"))
                    assert {x["host"]: x["running"] for x in listed} == {
                        "host-a": 0,
                        "host-b": 1,
                        "host-c": 0,
                    }
                    table = await cli_hosts(a)
                    for expected in ("host-a (this host)", "host-b", "acct-on-c", "alive"):
                        assert expected in table, table
                finally:
                    await b_service.__aexit__(None, None, None)

                # B stopped with its task running: it stays registered (another
                # host resumes the task if it is not back in time), silent.
                seen = await hosts_of(a)
                assert seen["host-b"]["state"] in ("alive", "silent")
                assert seen["host-b"]["running"] == 1
                await store.mark_host_dead("host-b", float("inf"), time.time())
                seen = await hosts_of(a)
                assert seen["host-b"]["state"] == "dead" and not seen["host-b"]["alive"]
                assert "dead" in await cli_hosts(a)
        finally:
            if beat is not None:
                beat.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await beat
            await store.close()


async def test_a_result_made_on_another_host_is_said_to_be_there(tmp_path: Path) -> None:
    with migrated_database() as url:
        async with (
            host_service(tmp_path, "host-a", ("demo-chat-api",), url, SCALE) as a,
            host_service(tmp_path, "host-b", ("demo-video",), url, SCALE) as b,
        ):
            clip = await b.submit("demo-video", "a short clip", gen_s=1)
            done = await b.wait_task(clip["id"])
            assert done["state"] == "success" and done["result"]["files"]
            assert done["host"] == "host-b" and done["result_on_host"] is None
            on_a = await a.task(clip["id"])
            assert on_a["host"] == "host-b"
            assert on_a["result_on_host"] == "host-b"
            refused = await a.http.get(f"/v1/tasks/{clip['id']}/result")
            assert refused.status_code == 409
            assert refused.json()["error"]["host"] == "host-b"
            assert (await b.http.get(f"/v1/tasks/{clip['id']}/result")).status_code == 200
            # A text answer has no files to fetch: nothing is said to be elsewhere.
            chat = await a.submit("demo-chat-api", "hello", gen_s=1)
            assert (await a.wait_task(chat["id"]))["result_on_host"] is None


async def test_one_host_on_sqlite_lists_itself_alive(tmp_path: Path) -> None:
    async with running_service(tmp_path, profiles=("demo-chat-api",), host_id="solo") as h:
        seen = await hosts_of(h)
        assert list(seen) == ["solo"]
        assert seen["solo"]["state"] == "alive" and seen["solo"]["this_host"]
        assert seen["solo"]["url"] == h.service.url
        assert seen["solo"]["accounts"] == [] and seen["solo"]["running"] == 0


async def test_the_hosts_table_reads_at_80_columns(tmp_path: Path) -> None:
    # A url cut to "http://1…" names no host: a narrow terminal wraps it.
    async with running_service(tmp_path, profiles=("demo-chat-api",), host_id="solo") as h:
        table = await cli_hosts(h, columns=80)
        lines = table.splitlines()
        assert all(len(line) <= 80 for line in lines), table
        assert "…" not in table, table
        body = [line.split("│") for line in lines if line.startswith("│")]
        assert " ".join(filter(None, (cells[1].strip() for cells in body))) == "solo (this host)"
        assert "".join(cells[-2].strip() for cells in body) == h.service.url, table
