"""The ComfyUI style against the demo ComfyUI server: real HTTP, real websocket."""

from __future__ import annotations

import asyncio
import gc
import hashlib
import io
import json
import logging
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from PIL import Image

from apirunner.runner import ApiRunner
from demo.comfyui import ComfyServer, start_demo_comfy
from dispatcher.clock import SystemClock
from dispatcher.errors import PermanentError, TaskCanceled
from dispatcher.models import Kind, Stage, Task, new_id
from dispatcher.profiles import Profile, load_profiles
from dispatcher.scheduling.protocol import Interruption, RunContext, RunResult
from dispatcher.settings import Settings

SCALE = 0.02
PROFILES_DIR = Path(__file__).resolve().parents[3] / "profiles"
WORKFLOW = json.loads((PROFILES_DIR / "workflows" / "txt2img.json").read_text())


class Recorder:
    def __init__(self) -> None:
        self.stages: list[tuple[Stage, float | None, int | None]] = []
        self.remote_ids: list[str] = []
        self.details: list[tuple[Stage, float | None, str | None]] = []
        self.changed = asyncio.Event()
        self.ctx: RunContext | None = None

    async def report_stage(self, stage: Stage, progress: float | None, queue: int | None) -> None:
        self.stages.append((stage, progress, queue))
        if self.ctx is not None:
            self.details.append((stage, progress, self.ctx.stage_detail))
        self.changed.set()

    async def record_remote_id(self, remote_id: str) -> None:
        self.remote_ids.append(remote_id)
        self.changed.set()

    async def until(self, condition: Any) -> None:
        async with asyncio.timeout(10):
            while not condition(self):
                self.changed.clear()
                await self.changed.wait()

    @property
    def progress(self) -> list[float]:
        return [p for _, p, _ in self.stages if p is not None]


class Comfy:
    def __init__(self, server: ComfyServer, http: httpx.AsyncClient, runner: ApiRunner) -> None:
        self.server = server
        self.http = http
        self.runner = runner
        self.profile: Profile = load_profiles(PROFILES_DIR, {"DEMO_COMFY_URL": server.url})[
            "demo-comfy"
        ]
        self.result_dir = Path()

    @property
    def url(self) -> str:
        return self.server.url

    async def stats(self) -> dict[str, Any]:
        return dict((await self.http.get(f"{self.url}/__stats")).json())

    def task(self, **params: Any) -> Task:
        return Task(
            id=new_id(),
            model="demo-comfy",
            kind=Kind.API,
            queue=self.profile.queue,
            params={"seed": 7, **params},
            fingerprint=new_id(),
            created_at=0.0,
            owner=self.profile.provider,
        )

    def ctx(self, task: Task) -> tuple[RunContext, Recorder]:
        recorder = Recorder()
        ctx = RunContext(
            task=task,
            profile=self.profile,
            lane=f"api:{self.profile.provider}",
            owner=self.profile.provider or "",
            clock=SystemClock(time_scale=SCALE),
            result_dir=self.result_dir / task.id,
            log=logging.LoggerAdapter(logging.getLogger("test.comfyui"), {"task": task.id}),
            report_stage=recorder.report_stage,
            record_remote_id=recorder.record_remote_id,
        )
        recorder.ctx = ctx
        return ctx, recorder

    async def run(self, task: Task) -> tuple[RunResult, Recorder]:
        ctx, recorder = self.ctx(task)
        return await self.runner.run(task, ctx), recorder

    async def other_client_prompt(self, steps: int) -> str:
        graph = json.loads(json.dumps(WORKFLOW))
        graph["6"]["inputs"]["text"] = f"someone else's picture {new_id()}"
        graph["3"]["inputs"]["steps"] = steps
        answer = await self.http.post(f"{self.url}/prompt", json={"prompt": graph})
        return str(answer.json()["prompt_id"])

    async def history(self, prompt_id: str) -> dict[str, Any]:
        answer = await self.http.get(f"{self.url}/history/{prompt_id}")
        return dict(answer.json().get(prompt_id) or {})

    async def wait_history(self, prompt_id: str) -> dict[str, Any]:
        for _ in range(500):
            entry = await self.history(prompt_id)
            if entry:
                return entry
            await asyncio.sleep(0.02)
        raise AssertionError(f"prompt {prompt_id} never ended")


@pytest.fixture
async def comfy(tmp_path: Path) -> AsyncIterator[Comfy]:
    server = await start_demo_comfy(time_scale=SCALE)
    profiles = load_profiles(PROFILES_DIR, {"DEMO_COMFY_URL": server.url})
    comfy_only = {"demo-comfy": profiles["demo-comfy"]}
    settings = Settings(state_dir=tmp_path / "state", http_timeout_s=10.0, time_scale=SCALE)
    runner = ApiRunner(settings, comfy_only, SystemClock(time_scale=SCALE), {"demo-comfy": 2})
    await runner.start()
    try:
        async with httpx.AsyncClient(timeout=10) as http:
            kit = Comfy(server, http, runner)
            kit.result_dir = tmp_path / "results"
            yield kit
    finally:
        await runner.aclose()
        await server.stop()


async def test_parameters_land_in_their_nodes_and_the_files_are_the_servers_pngs(
    comfy: Comfy,
) -> None:
    task = comfy.task(
        prompt="a lighthouse at dusk",
        negative_prompt="blurry",
        seed=1234,
        steps="12",  # text from a CSV lands as the INT the node wants
        width=320,
        height=192,
    )
    result, recorder = await comfy.run(task)

    (graph,) = (await comfy.stats())["prompts"]
    assert graph["6"]["inputs"]["text"] == "a lighthouse at dusk"
    assert graph["7"]["inputs"]["text"] == "blurry"
    assert (graph["3"]["inputs"]["seed"], graph["3"]["inputs"]["steps"]) == (1234, 12)
    assert (graph["5"]["inputs"]["width"], graph["5"]["inputs"]["height"]) == (320, 192)
    assert graph["4"] == WORKFLOW["4"]  # untouched nodes stay as exported

    (prompt_id,) = recorder.remote_ids
    assert result.meta["remote_id"] == prompt_id
    # Progress reached the task, step by step, up to 100 %, with the node at work.
    assert recorder.progress[-1] == 100.0 and len(set(recorder.progress)) >= 12
    sampling = [d for stage, p, d in recorder.details if p and 0 < p < 100]
    assert sampling and set(sampling) == {"node 3 (KSampler)"}
    assert (Stage.GENERATING, 100.0, "node 8 (VAEDecode)") in recorder.details
    (file,) = result.files
    (output,) = result.meta["outputs"]
    served = await comfy.http.get(f"{comfy.url}/view", params=output)
    assert hashlib.sha256(served.content).hexdigest() == file.sha256
    assert file.name == output["filename"] and file.content_type == "image/png"
    with Image.open(io.BytesIO(Path(file.path).read_bytes())) as img:
        assert img.size == (320, 192)


async def test_the_prompt_text_and_the_seed_change_the_pixels(comfy: Comfy) -> None:
    first, _ = await comfy.run(comfy.task(prompt="shot 1", seed=1))
    again, _ = await comfy.run(comfy.task(prompt="shot 1", seed=1))
    other_seed, _ = await comfy.run(comfy.task(prompt="shot 1", seed=2))
    other_text, _ = await comfy.run(comfy.task(prompt="shot 2", seed=1))
    digest = [r.files[0].sha256 for r in (first, again, other_seed, other_text)]
    assert digest[0] == digest[1]  # a retry with the stored seed reproduces the image
    assert len({digest[0], digest[2], digest[3]}) == 3


async def test_node_errors_fail_the_task_naming_node_and_input(comfy: Comfy) -> None:
    task = comfy.task(prompt="no steps at all", steps=0)
    ctx, recorder = comfy.ctx(task)
    with pytest.raises(PermanentError) as caught:
        await comfy.runner.run(task, ctx)
    assert caught.value.kind == "node_errors"
    assert "node 3 (KSampler) input steps" in str(caught.value)
    assert "smaller than min" in str(caught.value)
    assert recorder.remote_ids == []  # nothing was queued


async def test_a_node_failing_while_running_is_a_clear_error_and_a_rerun_works(
    comfy: Comfy,
) -> None:
    task = comfy.task(prompt="shot 5, fail-once")
    ctx, _ = comfy.ctx(task)
    with pytest.raises(PermanentError) as caught:
        await comfy.runner.run(task, ctx)
    assert caught.value.kind == "node_failed"
    assert "node 3 (KSampler): RuntimeError" in str(caught.value)
    result, _ = await comfy.run(task.replace(attempt=2))
    assert len(result.files) == 1


async def test_cancel_deletes_our_queued_prompt_and_leaves_the_running_one(comfy: Comfy) -> None:
    theirs = await comfy.other_client_prompt(steps=3000)
    task = comfy.task(prompt="waits behind it")
    ctx, recorder = comfy.ctx(task)
    running = asyncio.create_task(comfy.runner.run(task, ctx))
    await recorder.until(lambda r: any(q == 1 for _, _, q in r.stages))
    # Waiting behind another prompt is not "generating".
    assert (Stage.QUEUED, None, "queued on server, 1 ahead") in recorder.details
    assert not any(stage is Stage.GENERATING for stage, _, _ in recorder.stages)
    ctx.interrupt(Interruption.CANCELED)
    with pytest.raises(TaskCanceled):
        await running
    stats = await comfy.stats()
    assert (stats["deleted"], stats["interrupts"]) == (1, 0)
    queue = (await comfy.http.get(f"{comfy.url}/queue")).json()
    assert [item[1] for item in queue["queue_running"]] == [theirs]
    assert queue["queue_pending"] == []
    await comfy.http.post(f"{comfy.url}/interrupt", json={"prompt_id": theirs})


async def test_cancel_interrupts_our_running_prompt_only(comfy: Comfy) -> None:
    task = comfy.task(prompt="a very long render", steps=3000)
    ctx, recorder = comfy.ctx(task)
    running = asyncio.create_task(comfy.runner.run(task, ctx))
    await recorder.until(lambda r: any(p for p in r.progress))
    theirs = await comfy.other_client_prompt(steps=5)
    ctx.interrupt(Interruption.CANCELED)
    with pytest.raises(TaskCanceled):
        await running
    (ours,) = recorder.remote_ids
    # Canceled only once the server confirmed: our history is already written.
    entry = await comfy.history(ours)
    assert entry["status"]["messages"][-1][0] == "execution_interrupted"
    other = await comfy.wait_history(theirs)
    assert other["status"]["status_str"] == "success"  # the next prompt was not hit
    stats = await comfy.stats()
    assert (stats["interrupts"], stats["deleted"], stats["max_running"]) == (1, 0, 1)


async def test_a_restart_mid_run_resumes_without_posting_again(comfy: Comfy) -> None:
    task = comfy.task(prompt="survives a restart", steps=150)
    ctx, recorder = comfy.ctx(task)
    running = asyncio.create_task(comfy.runner.run(task, ctx))
    await recorder.until(lambda r: any(p for p in r.progress))
    running.cancel()  # what a shutdown does to a running attempt
    with pytest.raises(asyncio.CancelledError):
        await running
    (prompt_id,) = recorder.remote_ids
    result, resumed = await comfy.run(task.replace(remote_id=prompt_id))
    assert resumed.remote_ids == []
    assert result.meta["remote_id"] == prompt_id and len(result.files) == 1
    stats = await comfy.stats()
    assert len(stats["prompts"]) == 1 and stats["interrupts"] == 0


async def test_a_dropped_websocket_falls_back_to_polling_history(comfy: Comfy) -> None:
    task = comfy.task(prompt="through a flaky proxy", steps=100)
    ctx, recorder = comfy.ctx(task)
    running = asyncio.create_task(comfy.runner.run(task, ctx))
    await recorder.until(lambda r: any(p for p in r.progress))
    dropped = (await comfy.http.post(f"{comfy.url}/__drop_sockets")).json()["dropped"]
    assert dropped == 1
    result = await running
    assert len(result.files) == 1 and result.meta["polls"] >= 1


IMG2IMG_PROFILE = """
name = "comfy-img2img"
kind = "api"
provider = "comfy-img2img"
[api]
base_url = "{url}"
style = "comfyui"
workflow = "img2img.json"
inputs = {{ prompt = "6.inputs.text", seed = "3.inputs.seed" }}
images = {{ reference_image = "10.inputs.image" }}
"""


def _png(path: Path, colour: tuple[int, int, int]) -> str:
    Image.new("RGB", (64, 48), colour).save(path, format="PNG")
    return str(path)


async def test_a_reference_image_is_uploaded_and_its_name_put_in_the_node(
    comfy: Comfy, tmp_path: Path
) -> None:
    graph = json.loads(json.dumps(WORKFLOW))
    graph["10"] = {"class_type": "LoadImage", "inputs": {"image": "example.png"}}
    graph["11"] = {"class_type": "VAEEncode", "inputs": {"pixels": ["10", 0], "vae": ["4", 2]}}
    graph["3"]["inputs"]["latent_image"] = ["11", 0]
    del graph["5"]
    (tmp_path / "img2img.json").write_text(json.dumps(graph))
    (tmp_path / "img2img.toml").write_text(IMG2IMG_PROFILE.format(url=comfy.url))
    profile = load_profiles(tmp_path)["comfy-img2img"]
    settings = Settings(state_dir=tmp_path / "state", http_timeout_s=10.0, time_scale=SCALE)
    runner = ApiRunner(settings, {profile.name: profile}, SystemClock(time_scale=SCALE), {})
    await runner.start()
    comfy.runner, comfy.profile = runner, profile
    try:
        # Local reference images are read only from the input dirs.
        inputs = settings.resolved_input_dirs[0]
        inputs.mkdir(parents=True)
        red = _png(inputs / "red.png", (200, 0, 0))
        task = comfy.task(prompt="the same scene", reference_image=red)
        first, _ = await comfy.run(task.replace(model=profile.name))
        again, _ = await comfy.run(task.replace(id=new_id(), model=profile.name))
        blue = _png(inputs / "blue.png", (0, 0, 200))
        other, _ = await comfy.run(
            comfy.task(prompt="the same scene", reference_image=blue).replace(model=profile.name)
        )
        gone = comfy.task(prompt="x", reference_image=str(inputs / "gone.png"))
        with pytest.raises(PermanentError) as caught:
            await comfy.run(gone.replace(model=profile.name))
        assert caught.value.kind == "input" and "reference_image" in str(caught.value)
    finally:
        await runner.aclose()
    prompts = (await comfy.stats())["prompts"]
    names = [p["10"]["inputs"]["image"] for p in prompts]
    assert names[0] == names[1] != names[2] and names[0].startswith("dispatcher-")
    uploaded = await comfy.http.get(
        f"{comfy.url}/view", params={"filename": names[0], "type": "input"}
    )
    assert uploaded.content == Path(red).read_bytes()
    with Image.open(first.files[0].path) as img:
        assert img.size == (64, 48)  # the render follows the reference's size
    assert first.files[0].sha256 == again.files[0].sha256 != other.files[0].sha256


TWO_SAVES_PROFILE = """
name = "comfy-two-saves"
kind = "api"
provider = "comfy-two-saves"
[api]
base_url = "{url}"
style = "comfyui"
workflow = "two-saves.json"
inputs = {{ prompt = "6.inputs.text", seed = "3.inputs.seed" }}
"""


async def test_two_outputs_of_one_name_in_two_subfolders_are_two_files(
    comfy: Comfy, tmp_path: Path
) -> None:
    # ComfyUI numbers files per prefix: "a/ComfyUI" and "b/ComfyUI" both
    # start at ComfyUI_00001_.png, one in output/a, one in output/b.
    graph = json.loads(json.dumps(WORKFLOW))
    graph["3"]["inputs"]["steps"] = 2
    graph["9"]["inputs"]["filename_prefix"] = "a/ComfyUI"
    graph["13"] = {**graph["3"], "inputs": {**graph["3"]["inputs"], "seed": 99}}
    graph["14"] = {"class_type": "VAEDecode", "inputs": {"samples": ["13", 0], "vae": ["4", 2]}}
    graph["15"] = {
        "class_type": "SaveImage",
        "inputs": {"filename_prefix": "b/ComfyUI", "images": ["14", 0]},
    }
    (tmp_path / "two-saves.json").write_text(json.dumps(graph))
    (tmp_path / "two-saves.toml").write_text(TWO_SAVES_PROFILE.format(url=comfy.url))
    profile = load_profiles(tmp_path)["comfy-two-saves"]
    settings = Settings(state_dir=tmp_path / "state", http_timeout_s=10.0, time_scale=SCALE)
    runner = ApiRunner(settings, {profile.name: profile}, SystemClock(time_scale=SCALE), {})
    await runner.start()
    comfy.runner, comfy.profile = runner, profile
    try:
        result, _ = await comfy.run(comfy.task(prompt="twins").replace(model=profile.name))
    finally:
        await runner.aclose()

    outputs = result.meta["outputs"]
    assert sorted((o["subfolder"], o["filename"]) for o in outputs) == [
        ("a", "ComfyUI_00001_.png"),
        ("b", "ComfyUI_00001_.png"),
    ]
    paths = [Path(f.path) for f in result.files]
    assert len(set(paths)) == 2, "both outputs were written to one path"
    for file, output in zip(result.files, outputs, strict=True):
        served = await comfy.http.get(f"{comfy.url}/view", params=output)
        on_disk = Path(file.path).read_bytes()
        assert hashlib.sha256(on_disk).hexdigest() == file.sha256
        assert on_disk == served.content
    assert result.files[0].sha256 != result.files[1].sha256
    # Nothing but the two results (no part files) in the attempt's dir.
    assert sorted(p.name for p in paths[0].parent.iterdir()) == sorted(p.name for p in paths)


def _reset_peak_rss() -> None:
    # Linux: "5" resets this process's VmHWM (peak resident set) to its RSS now.
    Path("/proc/self/clear_refs").write_text("5")


def _peak_rss() -> int:
    found = re.search(r"VmHWM:\s+(\d+) kB", Path("/proc/self/status").read_text())
    assert found is not None
    return int(found.group(1)) * 1024


async def test_a_flooding_websocket_is_bounded_by_bytes_and_the_task_finishes(
    comfy: Comfy,
) -> None:
    # After the end signal the server floods the socket with binary frames
    # (previews) and huge texts, and holds /view back until all are sent: a
    # client that queues what it receives would hold every byte of them.
    size = 3 * 1024 * 1024
    flood = {"binary": 60, "text": 40, "size": size}
    await comfy.http.post(f"{comfy.url}/__flood", json=flood)
    gc.collect()
    before = psutil.Process().memory_info().rss
    _reset_peak_rss()
    result, recorder = await comfy.run(comfy.task(prompt="a flooded socket", steps=3))
    grown = _peak_rss() - before

    assert len(result.files) == 1 and recorder.progress[-1] == 100.0
    flooded = (await comfy.stats())["flooded"]
    assert flooded >= 100 * size
    # The old reader held all of it (~500 MB); now binary frames are dropped
    # on arrival and texts are kept only up to the inbox's byte budget.
    assert grown < flooded // 4, f"peak RSS grew {grown >> 20} MiB for {flooded >> 20} MiB sent"
