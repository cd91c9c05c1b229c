"""A ComfyUI server that stops answering: the provider shows it, the task
says it waits, both clear when it is back; a dead server of two costs no
attempt (issue 28, finding 4)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from demo.comfyui import start_demo_comfy
from tests.support.harness import Harness, running_service
from tests.support.helpers import REPO

SCALE = 0.02


def _two_gpus(tmp_path: Path, url_a: str, url_b: str) -> None:
    text = (REPO / "profiles" / "demo-comfy.toml").read_text(encoding="utf-8")
    text = text.replace('name = "demo-comfy"', 'name = "two-gpus"')
    text = text.replace('provider = "demo-comfy"', 'providers = ["gpu-a", "gpu-b"]')
    text = text.replace("${DEMO_COMFY_URL}", url_a)
    # 6,000 nominal s (120 s here): the long renders below never time out.
    text = text.replace("timeout_s = 600", "timeout_s = 6000")
    text += f'\n[api.providers.gpu-b]\nbase_url = "{url_b}"\n'
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "two-gpus.toml").write_text(text, encoding="utf-8")


async def _account(h: Harness, name: str) -> dict[str, Any]:
    accounts = (await h.http.get("/v1/accounts")).json()
    return next(a for a in accounts if a["name"] == name)


async def _until(probe: Callable[[], Any], what: str) -> Any:
    for _ in range(1000):
        seen = await probe()
        if seen:
            return seen
        await asyncio.sleep(0.02)
    raise AssertionError(f"never: {what}")


async def test_an_unreachable_server_is_shown_skipped_and_cleared_when_back(
    tmp_path: Path,
) -> None:
    a = await start_demo_comfy(time_scale=SCALE)
    b = await start_demo_comfy(time_scale=SCALE)
    try:
        _two_gpus(tmp_path, a.url, b.url)
        await a.go_down()
        async with running_service(tmp_path, profiles=(), time_scale=SCALE) as h:
            # gpu-a refuses connections: every shot renders on gpu-b, none
            # spends an attempt on the dead server.
            shots = [
                {"model": "two-gpus", "params": {"prompt": f"shot {i}", "steps": 5}}
                for i in range(4)
            ]
            done = await h.wait_job((await h.job("story", shots))["id"])
            assert done["counts"]["success"] == 4
            assert {(t["owner"], t["attempt"]) for t in done["tasks"]} == {("gpu-b", 1)}
            down = await _account(h, "gpu-a")
            assert down["state"] == "unreachable" and down["since"]
            assert down["reason"].startswith("unreachable since ")
            assert (await _account(h, "gpu-b"))["state"] == "ok"

            # Back: the next render on it clears the outage.
            await a.come_back()
            long = [await h.submit("two-gpus", f"a long render {i}", steps=6000) for i in range(2)]

            async def rendering() -> list[dict[str, Any]] | None:
                tasks = [await h.task(t["id"]) for t in long]
                return tasks if all(t["progress"] for t in tasks) else None

            tasks = await _until(rendering, "both long renders show progress")
            assert (await _account(h, "gpu-a"))["state"] == "ok"
            on_a = next(t for t in tasks if t["owner"] == "gpu-a")

            # Down while it renders: the task says it waits, the provider is unreachable.
            await a.go_down()
            at_outage = (await h.task(on_a["id"]))["progress"]

            async def waiting() -> dict[str, Any] | None:
                task = await h.task(on_a["id"])
                detail = task.get("stage_detail") or ""
                return task if detail.startswith("waiting for the server") else None

            task = await _until(waiting, "the task says it waits for the server")
            assert task["state"] == "running" and "unreachable since" in task["stage_detail"]
            assert (await _account(h, "gpu-a"))["state"] == "unreachable"

            await a.come_back()

            async def back() -> dict[str, Any] | None:
                task = await h.task(on_a["id"])
                account = await _account(h, "gpu-a")
                cleared = not (task.get("stage_detail") or "").startswith("waiting")
                return task if cleared and account["state"] == "ok" else None

            task = await _until(back, "the outage clears on the task and the provider")
            assert task["state"] == "running" and task["attempt"] == 1

            async def moving() -> bool:
                task = await h.task(on_a["id"])
                assert task["state"] == "running"  # 6,000 steps: far from done
                return bool((task["progress"] or 0) > at_outage)

            # The socket is opened again: the percentage moves on.
            await _until(moving, "progress moves again after the outage")
            for t in long:
                await h.http.post(f"/v1/tasks/{t['id']}/cancel")
            for t in long:
                assert (await h.wait_task(t["id"]))["state"] == "canceled"
    finally:
        await a.stop()
        await b.stop()
