"""API providers that look after themselves: missing and revoked keys hold
tasks instead of failing them; 429 storms shrink the lane. Real HTTP against
the demo provider."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path
from typing import Any

import httpx
import pytest

from dispatcher.accounts import apikeys
from tests.support.harness import Harness, running_service
from tests.support.helpers import REPO

UNSET_KEY_ENV = "DISPATCHER_TEST_KEY_NEVER_SET"


async def lane(h: Harness, name: str) -> dict[str, Any]:
    lanes = (await h.http.get("/v1/lanes")).json()
    return next(x for x in lanes if x["name"] == name)


def keyless_profile(tmp_path: Path) -> None:
    """demo-chat-api under another provider whose key variable nobody set."""
    target = tmp_path / "profiles"
    target.mkdir(exist_ok=True)
    text = (REPO / "profiles" / "demo-chat-api.toml").read_text()
    text = text.replace('name = "demo-chat-api"', 'name = "keyless-chat"')
    text = text.replace('provider = "demo"', 'provider = "keyless"')
    text = text.replace('auth_env = "DEMO_API_KEY"', f'auth_env = "{UNSET_KEY_ENV}"')
    (target / "keyless-chat.toml").write_text(text)


async def test_an_unset_key_holds_tasks_until_it_is_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(UNSET_KEY_ENV, raising=False)
    keyless_profile(tmp_path)
    async with running_service(tmp_path, profiles=("demo-chat-api",)) as h:
        keyless = (await h.accounts())["keyless"]
        assert (keyless["kind"], keyless["state"]) == ("api", "needs_attention")
        assert UNSET_KEY_ENV in keyless["reason"]
        assert (await lane(h, "api:keyless"))["state"] == "needs_attention"

        waiting = await h.submit("keyless-chat", "needs a key")
        # A task of the healthy provider runs meanwhile: the keyless one waits.
        other = await h.wait_task((await h.submit("demo-chat-api", "has a key"))["id"])
        assert other["state"] == "success"
        held = await h.task(waiting["id"])
        assert (held["state"], held["attempt"]) == ("pending", 1)

        monkeypatch.setenv(UNSET_KEY_ENV, "a-key-at-last")
        await h.http.post("/v1/accounts/keyless/enable")
        done = await h.wait_task(waiting["id"])
        assert (done["state"], done["attempt"]) == ("success", 1)


async def test_a_revoked_key_holds_the_task_that_met_it(tmp_path: Path) -> None:
    async with running_service(tmp_path, profiles=("demo-chat-api",)) as h:
        async with httpx.AsyncClient() as client:
            (await client.post(f"{h.demo_api}/__keys/revoke")).raise_for_status()
            task = await h.submit("demo-chat-api", "meets a 401")
            account = await h.wait_account("demo", "needs_attention")
            assert "401" in account["reason"]
            held = await h.task(task["id"])
            assert (held["state"], held["attempt"], held["owner"]) == ("pending", 1, None)
            queued = await h.submit("demo-chat-api", "waits behind it")
            assert (await h.task(queued["id"]))["state"] == "pending"

            (await client.post(f"{h.demo_api}/__keys/restore")).raise_for_status()
        await h.http.post("/v1/accounts/demo/enable")
        for task_id in (task["id"], queued["id"]):
            done = await h.wait_task(task_id)
            assert (done["state"], done["attempt"]) == ("success", 1)
        assert (await h.accounts())["demo"]["state"] == "ok"


async def test_a_429_storm_without_retry_after_halves_the_lane_then_it_grows_back(
    tmp_path: Path,
) -> None:
    async with running_service(tmp_path, profiles=("demo-chat-api",)) as h:
        assert (await lane(h, "api:demo"))["effective_concurrency"] == 3
        await h.demo_mode({"mode": "429_storm", "count": 4, "header": "none"})
        first = await h.wait_task((await h.submit("demo-chat-api", "through the storm"))["id"])
        assert (first["state"], first["attempt"]) == ("success", 1)
        shrunk = await lane(h, "api:demo")
        assert (shrunk["concurrency"], shrunk["effective_concurrency"]) == (3, 1)
        metrics = (await h.http.get("/metrics")).text
        assert 'dispatcher_lane_effective_concurrency{lane="api:demo"} 1.0' in metrics

        # One at a time now: tasks submitted together run one after another.
        tasks = [(await h.submit("demo-chat-api", f"calm {i}", gen_s=1))["id"] for i in range(4)]
        done = [await h.wait_task(t) for t in tasks]
        assert all(t["state"] == "success" for t in done)
        ordered = sorted(done, key=lambda t: t["started_at"])
        for before, after in pairwise(ordered):
            assert after["started_at"] >= before["finished_at"] - 0.01
        # Five successes in a row (the storm's own task among them): one slot back.
        assert (await lane(h, "api:demo"))["effective_concurrency"] == 2


@pytest.fixture
def keyless_dotenv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The keyless provider's key in no environment; a working dir whose `.env` gets it later."""
    monkeypatch.setenv(UNSET_KEY_ENV, "-")
    monkeypatch.delenv(UNSET_KEY_ENV)  # and unset again when the test ends
    monkeypatch.setattr(apikeys, "_FROM_DOTENV", {})
    keyless_profile(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return work / ".env"


async def test_a_key_added_to_dotenv_is_read_on_reload_and_the_account_clears_itself(
    tmp_path: Path, keyless_dotenv: Path
) -> None:
    async with running_service(tmp_path, profiles=("demo-chat-api",)) as h:
        assert (await h.accounts())["keyless"]["state"] == "needs_attention"
        waiting = await h.submit("keyless-chat", "needs a key")
        keyless_dotenv.write_text(f"{UNSET_KEY_ENV}=a-key-from-dotenv\n")
        assert (await h.http.post("/v1/reload")).status_code == 200
        # No enable needed: the cause is gone, so is the mark.
        assert (await h.accounts())["keyless"]["state"] == "ok"
        done = await h.wait_task(waiting["id"])
        assert (done["state"], done["attempt"]) == ("success", 1)


async def test_enable_reads_the_keys_again(tmp_path: Path, keyless_dotenv: Path) -> None:
    async with running_service(tmp_path, profiles=("demo-chat-api",)) as h:
        # Enabled with the key still missing: marked again at once, with why.
        again = (await h.http.post("/v1/accounts/keyless/enable")).json()
        assert again["state"] == "needs_attention" and UNSET_KEY_ENV in again["reason"]
        waiting = await h.submit("keyless-chat", "needs a key")
        keyless_dotenv.write_text(f"{UNSET_KEY_ENV}=a-key-from-dotenv\n")
        enabled = (await h.http.post("/v1/accounts/keyless/enable")).json()
        assert enabled["state"] == "ok"
        done = await h.wait_task(waiting["id"])
        assert (done["state"], done["attempt"]) == ("success", 1)


async def test_a_key_set_before_a_restart_clears_the_mark_of_the_last_run(
    tmp_path: Path, keyless_dotenv: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "state"
    async with running_service(tmp_path, profiles=("demo-chat-api",), state_dir=state) as h:
        assert (await h.accounts())["keyless"]["state"] == "needs_attention"
    monkeypatch.setenv(UNSET_KEY_ENV, "a-key-in-the-unit")
    async with running_service(tmp_path, profiles=("demo-chat-api",), state_dir=state) as h:
        assert (await h.accounts())["keyless"]["state"] == "ok"
        done = await h.wait_task((await h.submit("keyless-chat", "has its key now"))["id"])
        assert done["state"] == "success"
