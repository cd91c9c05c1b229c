"""Local reference images: read only from the input dirs, capped, hashed off the loop."""

from __future__ import annotations

import io
import threading
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

import dispatcher.tasks.fingerprint as fingerprint_module
from tests.support.harness import running_service


def _png(colour: str) -> bytes:
    out = io.BytesIO()
    with Image.new("RGB", (8, 8), colour) as img:
        img.save(out, "PNG")
    return out.getvalue()


def _task(ref: str, prompt: str = "draw it") -> dict[str, Any]:
    return {"model": "demo-chat-api", "params": {"prompt": prompt, "reference_image": ref}}


async def test_paths_outside_the_input_dirs_all_get_one_answer(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("not for you")
    picture = tmp_path / "outside.png"
    picture.write_bytes(_png("red"))
    async with running_service(tmp_path) as h:
        inputs = h.state_dir / "inputs"
        (inputs / "escape.png").symlink_to(picture)
        (inputs / "folder.png").mkdir()
        refs = [
            str(secret),  # exists, not an image
            str(picture),  # exists, an image, but outside
            str(tmp_path / "missing.png"),
            "/etc/shadow",
            f"file://{secret}",
            str(inputs / "escape.png"),  # a symlink leading out
            "escape.png",
            str(inputs / "folder.png"),
            str(inputs / "missing.png"),
            "../../outside.png",  # relative, climbing out
        ]
        answers = set()
        for ref in refs:
            response = await h.http.post("/v1/tasks", json=_task(ref))
            answers.add((response.status_code, response.json()["error"]["message"]))
        assert len(answers) == 1, answers
        ((status, message),) = answers
        assert status == 400 and "input dirs" in message
        assert await h.service.store.state_counts() == {}


async def test_a_picture_in_the_inputs_dir_is_used_by_name_or_path(tmp_path: Path) -> None:
    async with running_service(tmp_path) as h:
        inputs = h.state_dir / "inputs"
        (inputs / "cat.png").write_bytes(_png("blue"))
        by_name = await h.http.post("/v1/tasks", json=_task("cat.png"))
        assert by_name.status_code == 201, by_name.text
        by_path = await h.http.post("/v1/tasks", json=_task(str(inputs / "cat.png")))
        assert by_path.status_code == 200 and by_path.json()["deduped"]  # the same picture
        job = await h.http.post(
            "/v1/jobs", json={"name": "refs", "tasks": [_task(f"file://{inputs}/cat.png", "j")]}
        )
        assert job.status_code == 201, job.text
        assert job.json()["tasks"][0]["fingerprint"] != by_name.json()["fingerprint"]


async def test_an_oversized_reference_is_refused_before_it_is_read(tmp_path: Path) -> None:
    async with running_service(tmp_path, max_reference_image_bytes=1024**2) as h:
        huge = h.state_dir / "inputs" / "huge.png"
        with huge.open("wb") as handle:
            handle.truncate(8 * 1024**3)  # sparse: reading it would take minutes
        response = await h.http.post("/v1/tasks", json=_task("huge.png"))
        assert response.status_code == 400
        assert "at most 1,048,576" in response.json()["error"]["message"]


async def test_configured_input_dirs_replace_the_default(tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "dog.png").write_bytes(_png("green"))
    async with running_service(tmp_path, input_dirs=[mine]) as h:
        assert (await h.http.post("/v1/tasks", json=_task("dog.png"))).status_code == 201
        (h.state_dir / "inputs").mkdir(exist_ok=True)
        (h.state_dir / "inputs" / "cow.png").write_bytes(_png("white"))
        assert (await h.http.post("/v1/tasks", json=_task("cow.png"))).status_code == 400


async def test_images_are_hashed_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hashed_on: list[int] = []
    original = fingerprint_module.image_hash

    def recording(*args: Any, **kwargs: Any) -> str:
        hashed_on.append(threading.get_ident())
        return original(*args, **kwargs)

    monkeypatch.setattr(fingerprint_module, "image_hash", recording)
    async with running_service(tmp_path) as h:
        (h.state_dir / "inputs" / "a.png").write_bytes(_png("red"))
        assert (await h.http.post("/v1/tasks", json=_task("a.png"))).status_code == 201
        job = {"name": "j", "tasks": [_task("a.png", "in a job")]}
        assert (await h.http.post("/v1/jobs", json=job)).status_code == 201
    assert len(hashed_on) == 2
    assert threading.get_ident() not in hashed_on  # the loop's thread never decodes


async def test_the_demo_sample_still_reaches_both_vendors_once(tmp_path: Path) -> None:
    """`--demo` puts the sample batch's picture in the inputs dir; demo-video
    sends it as a multipart part, demo-queue uploads it once for two tasks,
    and the wait for the upload shows as the "uploading" stage."""
    async with running_service(tmp_path) as h:
        assert (h.state_dir / "inputs" / "lighthouse.png").is_file()
        tasks = [
            await h.submit("demo-video", "from the still", reference_image="lighthouse.png"),
            await h.submit("demo-queue", "poster one", reference_image="lighthouse.png"),
            await h.submit("demo-queue", "poster two", reference_image="lighthouse.png"),
        ]
        done = [await h.wait_task(task["id"]) for task in tasks]
        assert [task["state"] for task in done] == ["success"] * 3
        stats = await h.demo_stats()
        assert stats["uploads"] == 1 and len(stats["reference_hashes"]) == 3
        assert "uploading" in done[1]["stage_durations"]
