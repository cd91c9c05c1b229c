"""ComfyUI through the whole service, over HTTP: the field report's shot list,
live progress, cancel, de-duplication and clear errors."""

from __future__ import annotations

import asyncio
import base64
import io
from pathlib import Path
from typing import Any

import httpx
import pytest
from PIL import Image

from demo.bootstrap import Demo
from demo.comfyui import start_demo_comfy
from dispatcher.scheduling.decisions import DEDUP_WINDOW_S
from dispatcher.service.core import Service
from dispatcher.settings import Settings
from dispatcher.tasks.spec import parse_spec
from tests.support.harness import Harness, profiles_dir, running_service

PROFILES = ("demo-comfy",)
TIME_SCALE = 0.02  # running_service's default
DEDUP_WINDOW_REAL_S = DEDUP_WINDOW_S * TIME_SCALE


async def _comfy_stats(h: Harness) -> dict[str, Any]:
    return await h.demo_stats(h.demo_comfy)


async def test_a_shot_list_with_one_failed_shot_retried_alone_ends_with_8_images(
    tmp_path: Path,
) -> None:
    async with running_service(tmp_path, profiles=PROFILES) as h:
        shots: list[dict[str, Any]] = [
            {"model": "demo-comfy", "params": {"prompt": f"story 1, shot {i}: the harbour"}}
            for i in range(1, 9)
        ]
        shots[4]["params"]["prompt"] += " (fail-once)"
        job = await h.job("story 1", shots)
        first = await h.wait_job(job["id"])
        assert first["counts"]["success"] == 7 and first["counts"]["failed"] == 1
        (failed,) = [t for t in first["tasks"] if t["state"] == "failed"]
        assert "node 3 (KSampler)" in failed["error"]["message"]
        seeds = {t["id"]: t["params"]["seed"] for t in first["tasks"]}
        assert len(set(seeds.values())) == 8  # every shot got its own stored seed

        response = await h.http.post(f"/v1/jobs/{job['id']}/retry")
        assert response.status_code == 200, response.text
        done = await h.wait_job(job["id"])
        assert done["state"] == "success" and done["counts"]["success"] == 8
        for task in done["tasks"]:
            (image,) = task["result"]["files"]
            assert image["content_type"] == "image/png" and image["size"] > 0
            assert task["params"]["seed"] == seeds[task["id"]]  # the retry kept its seed
        retried = next(t for t in done["tasks"] if t["id"] == failed["id"])
        assert retried["attempt"] == 2
        # Eight shots, one of them twice: nothing else was sent again.
        assert len((await _comfy_stats(h))["prompts"]) == 9


async def test_progress_shows_on_the_task_while_it_renders_and_cancel_interrupts_it(
    tmp_path: Path,
) -> None:
    async with running_service(tmp_path, profiles=PROFILES) as h:
        # A short render first: the model's history says "about 0.1 s", so
        # the long one below is far past it while its progress is known.
        short = await h.submit("demo-comfy", "a quick sketch", steps=2)
        assert (await h.wait_task(short["id"]))["state"] == "success"
        task = await h.submit("demo-comfy", "a long render", steps=3000)
        seen: list[float] = []
        for _ in range(500):
            answer = await h.task(task["id"])
            if answer["progress"]:
                seen.append(answer["progress"])
            if len(seen) >= 3:
                break
            await asyncio.sleep(0.02)
        assert len(seen) >= 3 and 0 < seen[0] <= seen[-1] < 100
        assert answer["state"] == "running" and answer["remote_id"]
        # The ETA follows the progress: never "0 s" nor overdue beside "55 %".
        assert answer["eta_s"] > 0 and answer["overdue_s"] is None

        response = await h.http.post(f"/v1/tasks/{task['id']}/cancel")
        assert response.status_code == 200
        assert (await h.wait_task(task["id"]))["state"] == "canceled"
        stats = await _comfy_stats(h)
        assert (stats["interrupts"], stats["max_running"]) == (1, 1)


async def test_identical_shots_deduplicate_and_later_ones_hit_the_cache(
    tmp_path: Path,
) -> None:
    async with running_service(tmp_path, profiles=PROFILES) as h:
        first = await h.submit("demo-comfy", "the same shot", width=256)
        twin = await h.submit("demo-comfy", "the  same shot ", width="256")
        assert twin["deduped"] and twin["id"] == first["id"]
        done = await h.wait_task(first["id"])
        assert done["state"] == "success"
        await asyncio.sleep(DEDUP_WINDOW_REAL_S + 0.1)
        cached = await h.submit("demo-comfy", "the same shot", width=256)
        assert cached["from_cache"] and cached["id"] != first["id"]
        assert cached["result"]["files"][0]["sha256"] == done["result"]["files"][0]["sha256"]
        other = await h.submit("demo-comfy", "the same shot", width=256, seed=5)
        assert not other["deduped"] and other["id"] != first["id"]
        assert (await h.wait_task(other["id"]))["state"] == "success"
        assert len((await _comfy_stats(h))["prompts"]) == 2


async def test_a_graph_the_server_refuses_fails_the_task_at_once_naming_node_and_input(
    tmp_path: Path,
) -> None:
    async with running_service(tmp_path, profiles=PROFILES) as h:
        task = await h.submit("demo-comfy", "zero steps", steps=0)
        failed = await h.wait_task(task["id"])
        assert failed["state"] == "failed" and failed["attempt"] == 1  # permanent: no retry
        assert failed["error"]["kind"] == "node_errors"
        assert (
            "node 3 (KSampler) input steps: Value 0 smaller than min of 1"
            in (failed["error"]["message"])
        )
        assert failed["remote_id"] is None


async def test_unknown_parameters_are_refused_at_submit_with_the_known_ones(
    tmp_path: Path,
) -> None:
    async with running_service(tmp_path, profiles=PROFILES) as h:
        response = await h.http.post(
            "/v1/tasks",
            json={"model": "demo-comfy", "params": {"prompt": "x", "sampler": "euler"}},
        )
        assert response.status_code == 400
        message = response.json()["error"]["message"]
        assert "sampler" in message
        assert "known: height, negative_prompt, prompt, seed, steps, width" in message
        response = await h.http.post(
            "/v1/tasks", json={"model": "demo-comfy", "params": {"prompt": "x", "steps": "many"}}
        )
        assert response.status_code == 400 and "steps" in response.json()["error"]["message"]
        assert (await _comfy_stats(h))["prompts"] == []


async def test_a_restarted_service_resumes_the_prompt_without_posting_it_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The ComfyUI server outlives the dispatcher, as a real one does.
    comfy = await start_demo_comfy(time_scale=TIME_SCALE)
    monkeypatch.setenv("DEMO_COMFY_URL", comfy.url)
    settings = Settings(
        state_dir=tmp_path / "state",
        profiles_dir=profiles_dir(tmp_path, PROFILES),
        time_scale=TIME_SCALE,
    )
    try:
        service = Service(settings, demo=Demo())
        await service.start()
        try:
            spec = parse_spec(
                {"model": "demo-comfy", "params": {"prompt": "outlives", "steps": 500}}
            )
            task = (await service.ledger.submit(spec)).task
            service.scheduler.wake()
            for _ in range(500):
                current = await service.ledger.get(task.id)
                if current.remote_id and (await service.scheduler.progress(current))["progress"]:
                    break
                await asyncio.sleep(0.02)
            assert current.remote_id
        finally:
            await service.stop()
        async with httpx.AsyncClient() as http:
            still = (await http.get(f"{comfy.url}/history/{current.remote_id}")).json()
        assert still == {}  # the prompt is still rendering while no dispatcher runs
        service = Service(settings, demo=Demo())
        await service.start()
        try:
            for _ in range(500):
                done = await service.ledger.get(task.id)
                if done.state.value in ("success", "failed", "canceled"):
                    break
                await asyncio.sleep(0.02)
        finally:
            await service.stop()
        assert done.state.value == "success" and done.attempt == 1
        assert done.result is not None and done.result["meta"]["remote_id"] == current.remote_id
        async with httpx.AsyncClient() as http:
            stats = (await http.get(f"{comfy.url}/__stats")).json()
        assert len(stats["prompts"]) == 1 and stats["interrupts"] == 0
    finally:
        await comfy.stop()


STUDIO_PROFILE = """\
name = "studio"
kind = "api"
provider = "demo-comfy"

[api]
base_url = "${DEMO_COMFY_URL}"
style = "comfyui"
workflows = { txt2img = "workflows/txt2img.json", img2img = "workflows/img2img.json" }
images = { reference_image = "title:Reference.image" }
outputs = ["title:Save Image"]
overridable = ["title:KSampler.cfg", "title:KSampler.denoise"]

[api.inputs]
prompt = "title:Positive Prompt.text"
seed = "title:KSampler.seed"
steps = "title:KSampler.steps"
"""


async def test_img2img_by_titles_needs_its_reference_image_and_takes_marked_overrides(
    tmp_path: Path,
) -> None:
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "studio.toml").write_text(STUDIO_PROFILE, encoding="utf-8")
    buffer = io.BytesIO()
    Image.new("RGB", (64, 48), (200, 40, 40)).save(buffer, "PNG")
    reference = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    async with running_service(tmp_path, profiles=PROFILES) as h:
        response = await h.http.post(
            "/v1/tasks",
            json={"model": "studio", "params": {"prompt": "x", "workflow": "img2img"}},
        )
        assert response.status_code == 400
        assert "reference_image is required: workflow 'img2img'" in response.text
        task = await h.submit(
            "studio",
            "the same harbour, in red",
            workflow="img2img",
            reference_image=reference,
            steps=3,
            **{"title:KSampler.denoise": 0.4},
        )
        done = await h.wait_task(task["id"])
        assert done["state"] == "success", done["error"]
        (graph,) = (await _comfy_stats(h))["prompts"]
        # Node ids of the img2img export, found by their titles.
        assert graph["16"]["inputs"]["text"] == "the same harbour, in red"
        assert graph["13"]["inputs"]["denoise"] == 0.4 and graph["13"]["inputs"]["steps"] == 3
        assert graph["10"]["inputs"]["image"].startswith("dispatcher-")  # the upload's name
        assert [o["node"] for o in done["result"]["meta"]["outputs"]] == ["19"]
        response = await h.http.post(
            "/v1/tasks",
            json={"model": "studio", "params": {"prompt": "x", "title:KSampler.seed": 3}},
        )
        assert response.status_code == 400 and "title:KSampler.cfg" in response.text
