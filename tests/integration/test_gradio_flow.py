"""gradio apps as API lanes (`style = "gradio"`), through the whole service,
against real gradio apps (tests/gradio_apps/api_*.py) on loopback."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image

from apirunner.runner import ApiRunner
from dispatcher.clock import SystemClock
from dispatcher.models import Kind, Stage, Task, new_id
from dispatcher.profiles import load_profiles
from dispatcher.scheduling.protocol import RunContext
from dispatcher.settings import Settings
from tests.support.harness import serving
from tests.support.helpers import REPO
from tests.support.servicecli import clean_env, run_cli

TOKEN = "gradio-test-token"
TIME_SCALE = 0.02

PROFILES = {
    "gr-text": """
name = "gr-text"
kind = "api"
provider = "gr-text-app"
[api]
style = "gradio"
base_url = "http://127.0.0.1:{text}"
api_name = "/write"
timeout_s = 3000
inputs = {{ prompt = "prompt" }}
values = {{ words = 3 }}
""",
    "gr-broken": """
name = "gr-broken"
kind = "api"
provider = "gr-text-app"
[api]
style = "gradio"
base_url = "http://127.0.0.1:{text}"
api_name = "/broken"
timeout_s = 3000
inputs = {{ prompt = "prompt" }}
""",
    "gr-image": """
name = "gr-image"
kind = "api"
provider = "gr-image-app"
[api]
style = "gradio"
base_url = "http://127.0.0.1:{image}"
api_name = "/paint"
auth_env = "GR_TEST_TOKEN"
timeout_s = 3000
inputs = {{ prompt = "prompt", seed = "seed", width = "width", height = "height", steps = "steps" }}
images = {{ reference_image = "reference" }}
""",
    "gr-queue": """
name = "gr-queue"
kind = "api"
provider = "gr-queue-app"
[api]
style = "gradio"
base_url = "http://127.0.0.1:{queue}"
api_name = "/slow"
timeout_s = 3000
inputs = {{ prompt = "prompt", seconds = "seconds" }}
""",
}


@pytest.fixture(scope="module")
def apps(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, int]]:
    """The three apps in one process (gradio's import is the slow part)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "GRADIO_ANALYTICS_ENABLED": "False"}
    log_path = tmp_path_factory.mktemp("gradio") / "apps.log"
    with log_path.open("w") as log:  # the apps' tracebacks (an app error is one)
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.gradio_apps.api_serve", "--token", TOKEN],
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env=env,
            cwd=REPO,
        )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, f"the gradio apps did not start: {log_path.read_text()[-2000:]}"
        yield json.loads(line)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        if proc.stdout is not None:
            proc.stdout.close()


def _settings(tmp_path: Path, apps: dict[str, int], **overrides: Any) -> Settings:
    folder = tmp_path / "profiles"
    folder.mkdir(exist_ok=True)
    for name, text in PROFILES.items():
        (folder / f"{name}.toml").write_text(text.format(**apps))
    return Settings(
        state_dir=tmp_path / "state",
        profiles_dir=folder,
        time_scale=TIME_SCALE,
        input_dirs=[tmp_path / "inputs"],
        **overrides,
    )


async def _stats(port: int) -> dict[str, Any]:
    async with httpx.AsyncClient() as client:
        return dict((await client.get(f"http://127.0.0.1:{port}/__stats")).json())


def _expected_pixels(prompt: str, seed: int, width: int, height: int) -> Any:
    """What the image app paints for these params (api_image.paint)."""
    rng = np.random.default_rng([seed, len(prompt)])
    return rng.integers(0, 255, (height, width, 3), dtype=np.uint8)


@pytest.fixture
def token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GR_TEST_TOKEN", TOKEN)


async def test_a_batch_runs_end_to_end_with_byte_exact_results(
    tmp_path: Path, apps: dict[str, int], token: None
) -> None:
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    reference = Image.new("RGB", (32, 32), (10, 200, 30))
    reference.save(inputs / "ref.png")
    before = await _stats(apps["image"])
    async with serving(_settings(tmp_path, apps)) as h:
        tasks = [
            {"model": "gr-text", "params": {"prompt": "cat"}},
            {"model": "gr-text", "params": {"prompt": "dog"}},
            {
                "model": "gr-image",
                "params": {"prompt": "sea", "seed": 7, "width": 40, "height": 24},
            },
            {
                "model": "gr-image",
                "params": {"prompt": "sky", "seed": 8, "reference_image": "ref.png"},
            },
            {
                "model": "gr-image",
                "params": {"prompt": "sun", "seed": 9, "reference_image": "ref.png"},
            },
        ]
        job = await h.job("gradio batch", tasks)
        done = await h.wait_job(job["id"])
        assert done["state"] == "success", [t["error"] for t in done["tasks"] if t["error"]]
        by_prompt = {t["params"]["prompt"]: t for t in done["tasks"]}

        assert by_prompt["cat"]["result"]["text"] == "cat-0 cat-1 cat-2"
        assert by_prompt["dog"]["result"]["text"] == "dog-0 dog-1 dog-2"  # `values`

        for prompt, seed, size in (
            ("sea", 7, (40, 24)),
            ("sky", 8, (64, 64)),
            ("sun", 9, (64, 64)),
        ):
            task = by_prompt[prompt]
            (file,) = task["result"]["files"]
            ours = Path(file["path"]).read_bytes()
            # Byte-exact: the very file the app wrote (same machine, its path in meta).
            (output,) = task["result"]["meta"]["outputs"]
            assert ours == Path(output["path"]).read_bytes()
            assert task["remote_id"] == task["result"]["meta"]["remote_id"]
            # The params reached the app by name: its pixels for this seed and size.
            pixels = np.asarray(Image.open(io.BytesIO(ours)).convert("RGB"))
            expected = _expected_pixels(prompt, seed, *size)
            if prompt == "sea":
                assert (pixels == expected).all()
            else:  # the reference image is in the corner, the rest is the seed's
                assert (pixels[8:, 8:] == expected[8:, 8:]).all()
                assert tuple(pixels[0, 0]) == (10, 200, 30)

    after = await _stats(apps["image"])
    made = {
        k: after["requests"].get(k, 0) - before["requests"].get(k, 0) for k in after["requests"]
    }
    assert made.get("POST /gradio_api/call/paint") == 3  # one call per task, none twice
    assert made.get("POST /gradio_api/upload") == 1  # the same reference uploaded once


async def test_queue_rank_and_eta_are_the_tasks_and_cancel_takes_it_off_the_app(
    tmp_path: Path, apps: dict[str, int]
) -> None:
    app = f"http://127.0.0.1:{apps['queue']}/gradio_api"
    async with serving(_settings(tmp_path, apps)) as h, httpx.AsyncClient() as other:
        # Other users of the app fill its one-at-a-time queue first.
        for name in ("other-1", "other-2"):
            answer = await other.post(f"{app}/call/slow", json={"data": [name, 2.0]})
            assert answer.status_code == 200
        task = await h.submit("gr-queue", "ours", seconds=0.1)
        positions: set[int] = set()
        etas: list[float] = []
        for _ in range(400):
            seen = await h.task(task["id"])
            if seen["queue_position"] is not None:
                positions.add(seen["queue_position"])
                if seen["eta_s"] is not None:
                    etas.append(seen["eta_s"])
            if 1 in positions and etas:
                break
            await asyncio.sleep(0.02)
        assert seen["state"] == "running" and seen["remote_id"]
        # Events waiting ahead of ours in the app's queue: other-2, then none.
        assert 1 in positions and positions <= {0, 1}
        assert 0 < etas[0] < 60  # the app's estimate, not our history's

        response = await h.http.post(f"/v1/tasks/{task['id']}/cancel")
        assert response.status_code == 200
        assert (await h.wait_task(task["id"]))["state"] == "canceled"
    for _ in range(200):  # the others finish; ours never ran
        runs = (await _stats(apps["queue"]))["runs"]
        if runs.get("other-2"):
            break
        await asyncio.sleep(0.05)
    assert runs.get("other-1") == 1 and runs.get("other-2") == 1
    assert "ours" not in runs
    requests = (await _stats(apps["queue"]))["requests"]
    assert requests.get("POST /gradio_api/cancel") == 1


async def test_cancel_while_running_stops_the_apps_function(
    tmp_path: Path, apps: dict[str, int], token: None
) -> None:
    async with serving(_settings(tmp_path, apps)) as h:
        task = await h.submit("gr-image", "long", seed=1, steps=400)
        seen: list[float] = []
        for _ in range(500):
            answer = await h.task(task["id"])
            if answer["progress"]:
                seen.append(answer["progress"])
            if len(seen) >= 2:
                break
            await asyncio.sleep(0.02)
        assert seen and 0 < seen[0] <= seen[-1] < 100  # percent, as for every runner
        response = await h.http.post(f"/v1/tasks/{task['id']}/cancel")
        assert response.status_code == 200
        assert (await h.wait_task(task["id"]))["state"] == "canceled"


async def test_an_app_error_fails_the_task_at_once_with_the_apps_message(
    tmp_path: Path, apps: dict[str, int], token: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with serving(_settings(tmp_path, apps)) as h:
        task = await h.submit("gr-broken", "war")
        failed = await h.wait_task(task["id"])
        assert failed["state"] == "failed" and failed["attempt"] == 1
        assert failed["error"]["kind"] == "app_error"
        assert "cannot write about war" in failed["error"]["message"]

        response = await h.http.post(
            "/v1/tasks", json={"model": "gr-image", "params": {"prompt": "x", "sede": 3}}
        )
        assert response.status_code == 400  # a typo is refused, not dropped
        message = response.json()["error"]["message"]
        assert "sede" in message and "known: height, prompt, reference_image, seed" in message

        monkeypatch.delenv("GR_TEST_TOKEN")  # a private app without its token
        task = await h.submit("gr-image", "no key", seed=2)
        for _ in range(500):
            held = await h.task(task["id"])
            if held.get("waiting"):
                break
            await asyncio.sleep(0.02)
        # The app refused us: the lane is held for a person, the task waits.
        assert held["state"] == "pending"
        assert "HTTP 401: token needed" in held["waiting"]


async def test_a_restart_mid_run_fails_that_attempt_and_the_next_one_calls_again(
    tmp_path: Path, apps: dict[str, int]
) -> None:
    settings = _settings(tmp_path, apps)
    async with serving(settings) as h:
        task = await h.submit("gr-queue", "restart", seconds=1.0)
        first = await h.wait_remote_id(task["id"])
        for _ in range(500):  # our stream is open: the app's events come through it
            seen = await h.task(task["id"])
            if seen["queue_position"] is not None or seen["progress"] is not None:
                break
            await asyncio.sleep(0.02)
        else:
            raise AssertionError("no event from the app")
    # gradio forgot the event when our stream closed with the service.
    async with serving(settings) as h:
        done = await h.wait_task(task["id"], timeout_s=60)
        assert done["state"] == "success" and done["result"]["text"] == "RESTART"
        assert done["attempt"] == 2 and done["remote_id"] != first["remote_id"]
        lost = done["attempts"][0]["error"]
        assert lost["kind"] == "remote_lost" and "no longer serves event" in lost["message"]
    assert (await _stats(apps["queue"]))["runs"]["restart"] <= 2


async def test_a_resumed_task_reattaches_to_an_event_the_app_still_holds(
    tmp_path: Path, apps: dict[str, int]
) -> None:
    """The service stopped after the call and before it followed the event:
    the app still holds it, and the resumed attempt takes its result without
    calling again."""
    settings = _settings(tmp_path, apps)
    profiles = load_profiles(settings.profiles_dir)
    app = f"http://127.0.0.1:{apps['queue']}/gradio_api"
    async with httpx.AsyncClient() as other:
        answer = await other.post(f"{app}/call/slow", json={"data": ["held", 0.2]})
    event_id = answer.json()["event_id"]
    clock = SystemClock(TIME_SCALE)
    runner = ApiRunner(settings, profiles, clock, {})
    await runner.start()
    try:
        profile = profiles["gr-queue"]
        task = Task(
            id=new_id(),
            model="gr-queue",
            kind=Kind.API,
            queue=profile.queue,
            params={"prompt": "held", "seconds": 0.2},
            fingerprint=new_id(),
            created_at=0.0,
            owner="gr-queue-app",
            remote_id=event_id,
        )
        stages: list[tuple[Stage, float | None, int | None]] = []

        async def report(stage: Stage, progress: float | None, queue: int | None) -> None:
            stages.append((stage, progress, queue))

        async def record(remote_id: str) -> None:
            raise AssertionError(f"called the app again: {remote_id}")

        ctx = RunContext(
            task=task,
            profile=profile,
            lane="api:gr-queue-app",
            owner="gr-queue-app",
            clock=clock,
            result_dir=tmp_path / "results",
            log=logging.LoggerAdapter(logging.getLogger("test.gradio"), {}),
            report_stage=report,
            record_remote_id=record,
        )
        result = await runner.run(task, ctx)
    finally:
        await runner.aclose()
    assert result.text == "HELD" and result.meta["remote_id"] == event_id
    requests = (await _stats(apps["queue"]))["requests"]
    runs = (await _stats(apps["queue"]))["runs"]
    assert runs["held"] == 1 and requests["POST /gradio_api/call/slow"] >= 1


def test_check_live_asks_each_app_whether_the_mapping_fits(
    tmp_path: Path, apps: dict[str, int]
) -> None:
    _settings(tmp_path, apps)  # writes the profiles
    folder = tmp_path / "profiles"
    (folder / "gr-typo.toml").write_text(
        PROFILES["gr-queue"]
        .format(**apps)
        .replace('"gr-queue"', '"gr-typo"')
        .replace('seconds = "seconds"', 'seconds = "secs"')
    )
    env = clean_env({"GR_TEST_TOKEN": TOKEN})
    result = run_cli(["check", str(folder), "--live"], env, tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    for name in ("gr-text", "gr-broken", "gr-image", "gr-queue"):
        assert f"live ok  {name}" in result.stdout
    assert "/slow has no parameter 'secs' (its parameters: prompt, seconds)" in result.stderr
    assert "1 live problem(s) in 1 profile(s)" in result.stderr
    # Without its token, the private app says so.
    env.pop("GR_TEST_TOKEN")
    (folder / "gr-typo.toml").unlink()
    result = run_cli(["check", str(folder), "--live"], env, tmp_path)
    assert result.returncode == 2
    assert "gr-image (gr-image-app): $GR_TEST_TOKEN is not set" in result.stderr
