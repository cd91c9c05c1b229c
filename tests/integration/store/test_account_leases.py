"""A web account is served by one host: a second host configured with it is
refused for that account (and starts the rest), and takes it once the owner
has let it go."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness import running_service
from tests.pgdb import fresh_database

pytestmark = [pytest.mark.browser, pytest.mark.timeout(120)]

SCALE = 0.05
PROFILES = ("demo-chat-api", "demo-chat")


async def test_a_second_host_is_refused_an_account_until_its_owner_lets_it_go(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with fresh_database() as url:
        first = running_service(
            tmp_path / "one",
            profiles=PROFILES,
            time_scale=SCALE,
            database_url=url,
            host_id="host-1",
        )
        (tmp_path / "one").mkdir()
        (tmp_path / "two").mkdir()
        h1 = await first.__aenter__()
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
                assert done["account"] in ("demo-1", "demo-2")
        finally:
            if h1 is not None:
                await first.__aexit__(None, None, None)
