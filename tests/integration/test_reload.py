"""Profiles without restarts: a broken one among valid ones, and reloads while serving."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.support.harness import running_service
from tests.support.helpers import REPO

BROKEN = (
    'name = "demo-broken"\nkind = "api"\nprovider = "demo"\nmax_attempts = 0\n'
    'colour = "red"\n[api]\nbase_url = "${DEMO_API_URL}"\n'
)


async def test_a_broken_profile_refuses_its_model_while_the_others_serve(tmp_path: Path) -> None:
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "broken.toml").write_text(BROKEN)
    async with running_service(tmp_path, profiles=("demo-chat-api",)) as h:
        ok = await h.submit("demo-chat-api", "still served")
        assert (await h.wait_task(ok["id"]))["state"] == "success"
        refused = await h.http.post(
            "/v1/tasks", json={"model": "demo-broken", "params": {"prompt": "x"}}
        )
        assert refused.status_code == 400
        message = refused.json()["error"]["message"]
        assert "broken.toml" in message and "`max_attempts`" in message
        assert "unknown key `colour`" in message
        lanes = (await h.http.get("/v1/lanes")).json()
        (invalid,) = [lane for lane in lanes if lane.get("invalid")]
        assert invalid["name"] == "invalid:broken.toml"
        assert invalid["models"] == ["demo-broken"] and "`colour`" in invalid["invalid"]
        # Fixed and reloaded: the model serves.
        shutil.copy(REPO / "profiles" / "demo-video.toml", tmp_path / "profiles" / "broken.toml")
        answer = (await h.http.post("/v1/reload")).json()
        assert answer["added"] == ["demo-video"] and answer["invalid_profiles"] == []
        lanes = (await h.http.get("/v1/lanes")).json()
        assert not [lane for lane in lanes if lane.get("invalid")]


async def test_a_removed_model_waits_with_a_reason_and_runs_when_back(tmp_path: Path) -> None:
    async with running_service(tmp_path, profiles=("demo-chat-api", "demo-video")) as h:
        profiles = tmp_path / "profiles"
        # The lane is off, so the video task stays pending through the reload.
        await h.http.post("/v1/accounts/demo/disable", json={"reason": "hold the queue"})
        video = await h.submit("demo-video", "a clip", duration=1)
        (profiles / "demo-video.toml").rename(tmp_path / "demo-video.toml")
        shutil.copy(REPO / "profiles" / "demo-queue.toml", profiles / "demo-queue.toml")
        answer = (await h.http.post("/v1/reload")).json()
        assert (answer["added"], answer["removed"]) == (["demo-queue"], ["demo-video"])
        assert answer["models"] == ["demo-chat-api", "demo-queue"]
        await h.http.post("/v1/accounts/demo/enable")
        # The provider's lane still serves its other model, and a new
        # provider added by the reload serves at once.
        chat = await h.submit("demo-chat-api", "not held up")
        image = await h.submit("demo-queue", "a new provider's image")
        assert (await h.wait_task(chat["id"]))["state"] == "success"
        assert (await h.wait_task(image["id"]))["state"] == "success"
        waiting = await h.task(video["id"])
        assert waiting["state"] == "pending" and waiting["attempt"] <= 1
        assert waiting["note"] == (
            "model 'demo-video' is not loaded (profile removed); its tasks wait until it is back"
        )
        refused = await h.http.post(
            "/v1/tasks", json={"model": "demo-video", "params": {"prompt": "x"}}
        )
        assert refused.status_code == 400 and "unknown model 'demo-video'" in refused.text
        (tmp_path / "demo-video.toml").rename(profiles / "demo-video.toml")
        answer = (await h.http.post("/v1/reload")).json()
        assert answer["added"] == ["demo-video"]
        done = await h.wait_task(video["id"])
        assert done["state"] == "success" and done["attempt"] == 1 and "note" not in done


async def test_reload_applies_live_settings_and_refuses_what_needs_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with running_service(tmp_path, profiles=("demo-chat-api",)) as h:
        monkeypatch.setenv("DISPATCHER_CONCURRENCY", '{"demo": 1}')
        monkeypatch.setenv("DISPATCHER_CACHE_TTL_S", "60")
        monkeypatch.setenv("DISPATCHER_PORT", "1")  # not live: the running port stays
        answer = (await h.http.post("/v1/reload")).json()
        assert answer["settings"] == {"concurrency": {"demo": 1}, "cache_ttl_s": 60.0}
        assert answer["settings_error"] is None
        (lane,) = (await h.http.get("/v1/lanes")).json()
        assert lane["concurrency"] == 1
        assert h.service.cache.ttl_s == 60.0
        # Above the pool the provider's client was opened with: a restart applies it.
        monkeypatch.setenv("DISPATCHER_CONCURRENCY", '{"demo": 5}')
        answer = (await h.http.post("/v1/reload")).json()
        assert answer["settings"] == {} and "pool holds 3" in answer["settings_error"]
        monkeypatch.setenv("DISPATCHER_CONCURRENCY", '{"demo": 9}')
        answer = (await h.http.post("/v1/reload")).json()
        assert "between 1 and 5" in answer["settings_error"]
        (lane,) = (await h.http.get("/v1/lanes")).json()
        assert lane["concurrency"] == 1
        task = await h.submit("demo-chat-api", "still served")
        assert (await h.wait_task(task["id"]))["state"] == "success"
