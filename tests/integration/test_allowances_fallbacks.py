"""Issue 30 through the service: web accounts' daily allowances (real
Chromium on the demo web model) and fallback tasks that prefer the order
they give, saying why a model was passed over (API and web kinds)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from dispatcher.settings import Settings
from tests.support.harness import Harness, profiles_dir, running_service, serving

SCALE = 0.05


async def _until(check: Any, what: str, timeout_s: float = 90.0) -> Any:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        found = await check()
        if found:
            return found
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"never: {what}")
        await asyncio.sleep(0.05)


async def _lanes(h: Harness) -> dict[str, dict[str, Any]]:
    answer = (await h.http.get("/v1/lanes")).json()
    items = answer["items"] if isinstance(answer, dict) else answer
    return {lane["name"]: lane for lane in items}


def _limited(tmp_path: Path, daily_limit: int) -> Settings:
    folder = profiles_dir(tmp_path, ("demo-chat",))
    profile = folder / "demo-chat.toml"
    text = profile.read_text().replace("[web]\n", "[web]\ndaily_limit = 1\n", 1)
    profile.write_text(text.replace("daily_limit = 1", f"daily_limit = {daily_limit}"))
    return Settings(state_dir=tmp_path / "state", profiles_dir=folder, time_scale=SCALE, demo=True)


USED = "allowance used, 1 of 1, until 00:00 UTC"


@pytest.mark.browser
@pytest.mark.timeout(300)
async def test_an_account_that_used_its_allowance_gets_no_task_until_its_reset(
    tmp_path: Path,
) -> None:
    settings = _limited(tmp_path, 1)
    prompts = [f"say {word} [duration=1]" for word in ("one", "two", "three")]
    async with serving(settings) as h:
        job = await h.job(
            "capped", [{"model": "demo-chat", "params": {"prompt": p}} for p in prompts]
        )

        async def two_ran() -> list[dict[str, Any]] | None:
            tasks = [await h.task(t["id"]) for t in job["tasks"]]
            done = [t for t in tasks if t["state"] == "success"]
            return tasks if len(done) == 2 and all(t["state"] != "running" for t in tasks) else None

        tasks = await _until(two_ran, "two tasks ran, one per account")
        # Spread: each account ran one generation, then had used its day.
        assert sorted(t["owner"] for t in tasks if t["state"] == "success") == ["demo-1", "demo-2"]
        (waiting,) = [t for t in tasks if t["state"] == "pending"]
        assert waiting["eta_s"] is None
        assert waiting["waiting"] == f"web:demo-1: {USED}; web:demo-2: {USED}"
        lanes = await _lanes(h)
        for name in ("web:demo-1", "web:demo-2"):
            assert lanes[name]["state"] == "allowance_used" and lanes[name]["reason"] == USED
            assert lanes[name]["allowance"]["used"] == 1 and lanes[name]["allowance"]["reached"]
        # The plan of two more says which allowance stops them, and until when.
        plan = (
            await h.http.post(
                "/v1/plan",
                json={
                    "tasks": [
                        {"model": "demo-chat", "params": {"prompt": "four"}},
                        {"model": "demo-chat", "params": {"prompt": "five"}},
                    ]
                },
            )
        ).json()
        assert plan["models"][0]["per_day"] == 2
        assert plan["stops"][0].startswith(
            "allowance demo-chat/day (demo-1 1 of 1, demo-2 1 of 1 used): 0 left cover 0 of 2"
        )
        assert plan["stops"][0].endswith("the rest waits until 00:00 UTC")
    # The count is the store's: a restart does not give the day back.
    async with serving(settings) as h:
        await asyncio.sleep(SCALE * 30)  # rounds go by
        again = await h.task(waiting["id"])
        assert again["state"] == "pending", again
        assert again["waiting"] == f"web:demo-1: {USED}; web:demo-2: {USED}"
        # A larger allowance, reloaded: the waiting task runs at once.
        profile = settings.profiles_dir / "demo-chat.toml"
        profile.write_text(profile.read_text().replace("daily_limit = 1", "daily_limit = 2"))
        assert (await h.http.post("/v1/reload")).status_code == 200
        done = await h.wait_task(waiting["id"], timeout_s=90)
        assert done["state"] == "success" and done["skipped"] == []
        lanes = await _lanes(h)
        used = sorted(lanes[n]["allowance"]["used"] for n in ("web:demo-1", "web:demo-2"))
        assert used == [1, 2]


async def test_a_fallback_prefers_the_order_given_when_several_lanes_are_free(
    tmp_path: Path,
) -> None:
    async with running_service(
        tmp_path, profiles=("demo-chat-api", "demo-queue"), concurrency={"demo-queue": 1}
    ) as h:
        # Both providers idle: api:demo comes first in a round, yet each task
        # names demo-queue first, whose one slot takes the oldest.
        lines = [
            {
                "model": "demo-queue",
                "models": ["demo-queue", "demo-chat-api"],
                "params": {"prompt": f"a harbour at dawn {i}", "gen_s": 2},
            }
            for i in range(3)
        ]
        job = await h.job("either", lines)
        done = [await h.wait_task(t["id"]) for t in job["tasks"]]
        assert [t["state"] for t in done] == ["success"] * 3
        assert done[0]["model"] == "demo-queue" and done[0]["skipped"] == []
        # The others ran at once on the free lane of the equivalent model,
        # saying why their first choice was passed over.
        for task in done[1:]:
            assert task["model"] == "demo-chat-api" and task["owner"] == "demo"
            assert task["skipped"] == [{"model": "demo-queue", "reason": "api:demo-queue was busy"}]


@pytest.mark.browser
@pytest.mark.timeout(240)
async def test_a_fallback_across_kinds_prefers_its_first_choice_and_says_why_it_skipped_it(
    tmp_path: Path,
) -> None:
    async with running_service(
        tmp_path, profiles=("demo-chat-api", "demo-chat"), time_scale=SCALE
    ) as h:
        await h.browsers_started()
        body = {"model": "demo-chat-api", "models": ["demo-chat-api", "demo-chat"]}
        # Web accounts' lanes come first in a round: the API model, named
        # first and free, runs it all the same.
        first = await h.http.post("/v1/tasks", json={**body, "params": {"prompt": "hi, api"}})
        assert first.status_code == 201, first.text
        ran = await h.wait_task(first.json()["id"], timeout_s=60)
        assert ran["state"] == "success" and ran["model"] == "demo-chat-api", ran
        assert ran["kind"] == "api" and ran["skipped"] == []
        # Its provider switched off: the web model runs it, saying why.
        off = await h.http.post("/v1/accounts/demo/disable", json={"reason": "quota gone"})
        assert off.status_code == 200, off.text
        second = await h.http.post("/v1/tasks", json={**body, "params": {"prompt": "hi, web"}})
        done = await h.wait_task(second.json()["id"], timeout_s=90)
        assert done["state"] == "success" and done["model"] == "demo-chat", done
        assert done["skipped"] == [
            {"model": "demo-chat-api", "reason": "api:demo is disabled (quota gone)"}
        ]
