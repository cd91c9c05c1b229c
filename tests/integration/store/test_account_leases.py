"""A web account is served by one host: a second host configured with it is
refused for that account (and starts the rest), and takes it once the owner
has let it go."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.harness import Harness, running_service
from tests.support.pgdb import migrated_database

pytestmark = [pytest.mark.browser, pytest.mark.timeout(120)]

SCALE = 0.05
PROFILES = ("demo-chat-api", "demo-chat")


async def test_a_second_host_is_refused_an_account_until_its_owner_lets_it_go(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with migrated_database() as url:
        first = running_service(
            tmp_path / "one",
            profiles=PROFILES,
            time_scale=SCALE,
            database_url=url,
            host_id="host-1",
        )
        (tmp_path / "one").mkdir()
        (tmp_path / "two").mkdir()
        h1: Harness | None = await first.__aenter__()
        try:
            async with running_service(
                tmp_path / "two",
                profiles=PROFILES,
                time_scale=SCALE,
                database_url=url,
                host_id="host-2",
            ) as h2:
                lanes = {lane["name"]: lane for lane in (await h2.http.get("/v1/lanes")).json()}
                # Its API lane serves; each web account is listed as refused, naming the owner.
                assert "invalid" not in lanes["api:demo"]
                for account in ("demo-1", "demo-2"):
                    refused = lanes[f"web:{account}"]
                    assert refused["refused"] == "host-1"
                    assert "served by host 'host-1'" in refused["invalid"]
                assert "web account 'demo-1' is served by host 'host-1'" in caplog.text
                answer = await h2.submit("demo-chat-api", "still served", gen_s=1)
                assert (await h2.wait_task(answer["id"]))["state"] == "success"

                # The owner stops (its leases are released): a reload here takes them.
                await first.__aexit__(None, None, None)
                h1 = None
                await h2.http.post("/v1/reload")
                lanes = {lane["name"]: lane for lane in (await h2.http.get("/v1/lanes")).json()}
                assert "invalid" not in lanes["web:demo-1"], lanes["web:demo-1"]
                web = await h2.submit("demo-chat", "a web answer here now [duration=2]")
                done = await h2.wait_task(web["id"], timeout_s=60)
                assert done["state"] == "success", done
                assert done["owner"] in ("demo-1", "demo-2")
        finally:
            if h1 is not None:
                await first.__aexit__(None, None, None)


async def test_an_account_removed_on_its_host_moves_to_another_without_a_restart(
    tmp_path: Path,
) -> None:
    """`accounts remove` gives the lease back at once: the other host, still
    running all along, adds the account and serves it."""
    for name in ("one", "two"):
        (tmp_path / name).mkdir()
    with migrated_database() as url:
        hosts = [
            running_service(
                tmp_path / name,
                profiles=PROFILES,
                time_scale=SCALE,
                database_url=url,
                host_id=f"host-{n}",
            )
            for n, name in ((1, "one"), (2, "two"))
        ]
        async with hosts[0] as h1, hosts[1] as h2:
            added = await h1.http.post(
                "/v1/accounts", json={"name": "extra", "models": ["demo-chat"]}
            )
            assert added.status_code == 201, added.text
            # The account row is shared: host 2 sees it at its next reload and is refused it.
            await h2.http.post("/v1/reload")
            lanes = {lane["name"]: lane for lane in (await h2.http.get("/v1/lanes")).json()}
            assert lanes["web:extra"]["refused"] == "host-1"

            gone = await h1.http.delete("/v1/accounts/extra")
            assert gone.status_code == 200, gone.text
            assert gone.json()["removed"] is True
            moved = await h2.http.post(
                "/v1/accounts", json={"name": "extra", "models": ["demo-chat"]}
            )
            assert moved.status_code == 201, moved.text
            lanes = {lane["name"]: lane for lane in (await h2.http.get("/v1/lanes")).json()}
            assert "invalid" not in lanes["web:extra"], lanes["web:extra"]
            lanes = {lane["name"]: lane for lane in (await h1.http.get("/v1/lanes")).json()}
            assert "web:extra" not in lanes or lanes["web:extra"].get("refused") == "host-2"
