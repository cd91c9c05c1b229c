"""Reference images reach the vendor in each of the profile's three shapes,
prepared once and uploaded once (real HTTP against the demo provider)."""

from __future__ import annotations

import asyncio
import hashlib
import io
from pathlib import Path

import pytest
from PIL import Image

from dispatcher.errors import PermanentError
from dispatcher.models import Stage, Task
from dispatcher.profiles import Profile
from dispatcher.refimages import prepare
from dispatcher.scheduling.protocol import RunResult
from tests.integration.apirunner.conftest import Kit, Recorder


def _png(colour: str, side: int = 64) -> bytes:
    out = io.BytesIO()
    with Image.new("RGB", (side, side), colour) as img:
        img.save(out, "PNG")
    return out.getvalue()


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def inputs(kit: Kit) -> Path:
    folder = kit.runner._settings.resolved_input_dirs[0]
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _with_body(profile: Profile, **body: str) -> Profile:
    assert profile.api is not None
    submit = profile.api.submit.model_copy(
        update={"body": {**(profile.api.submit.body or {}), **body}}
    )
    api = profile.api.model_copy(update={"submit": submit, "upload": None})
    return profile.model_copy(update={"api": api})


async def _run(
    kit: Kit, model: str, params: dict[str, object], profile: Profile | None = None
) -> tuple[RunResult, Recorder, Task]:
    task = kit.task(model, {"gen_s": 0.2, **params})
    ctx, recorder = kit.ctx(task, profile)
    return await kit.runner.run(task, ctx), recorder, task


async def test_multipart_submit_delivers_the_prepared_bytes(kit: Kit, inputs: Path) -> None:
    source = _png("red", side=2000)  # over demo-video's max_edge_px = 1280
    (inputs / "first-frame.png").write_bytes(source)
    result, _, _ = await _run(
        kit, "demo-video", {"prompt": "pan", "reference_image": "first-frame.png"}
    )
    assert result.files
    stats = await kit.demo.stats()
    (received,) = stats["reference_hashes"].values()
    api = kit.profiles["demo-video"].api
    assert api is not None
    expected = prepare(source, api.references, "reference_image")
    assert received == [expected.sha256]
    with Image.open(io.BytesIO(expected.data)) as img:
        assert max(img.size) == 1280


@pytest.mark.parametrize("form", ["data_url", "base64"])
async def test_inline_placeholders_deliver_the_exact_bytes(
    kit: Kit, inputs: Path, form: str
) -> None:
    source = _png("blue")
    (inputs / "style.png").write_bytes(source)
    value = (
        "{reference_image:data_url}"
        if form == "data_url"
        else "data:image/png;base64,{reference_image:base64}"
    )
    profile = _with_body(kit.profiles["demo-queue"], image_url=value)
    await _run(kit, "demo-queue", {"prompt": "cat", "reference_image": "style.png"}, profile)
    stats = await kit.demo.stats()
    # No preparation needed (a 64 px PNG): the very bytes of the file arrive.
    assert list(stats["reference_hashes"].values()) == [[_sha(source)]]
    assert stats["uploads"] == 0


async def test_url_placeholder_refuses_a_local_file(kit: Kit, inputs: Path) -> None:
    (inputs / "style.png").write_bytes(_png("blue"))
    profile = _with_body(kit.profiles["demo-queue"], image_url="{reference_image:url}")
    with pytest.raises(PermanentError, match="only as http\\(s\\) URLs"):
        await _run(kit, "demo-queue", {"prompt": "cat", "reference_image": "style.png"}, profile)
    assert (await kit.demo.stats())["submits"] == 0


async def test_eight_tasks_sharing_two_images_make_two_uploads(kit: Kit, inputs: Path) -> None:
    images = {"a.png": _png("green", 1500), "b.png": _png("yellow", 300)}
    for name, data in images.items():
        (inputs / name).write_bytes(data)
    runs = [
        _run(kit, "demo-queue", {"prompt": f"shot {i}", "reference_image": name})
        for i, name in enumerate(list(images) * 4)
    ]
    outcomes = await asyncio.gather(*runs)
    stats = await kit.demo.stats()
    assert stats["uploads"] == 2
    api = kit.profiles["demo-queue"].api
    assert api is not None
    sent = {prepare(data, api.references, "reference_image").sha256 for data in images.values()}
    received = [h for hashes in stats["reference_hashes"].values() for h in hashes]
    assert len(received) == 8 and set(received) == sent
    assert stats["upload_bytes"] < sum(len(d) for d in images.values())  # resized to 1024 px
    for _, recorder, _ in outcomes:
        assert recorder.stages[0][0] is Stage.UPLOADING


async def test_an_expired_upload_is_uploaded_again_once(kit: Kit, inputs: Path) -> None:
    source = _png("purple")
    (inputs / "hero.png").write_bytes(source)
    params = {"reference_image": "hero.png"}
    await _run(kit, "demo-queue", {"prompt": "one", **params})
    await kit.demo.mode(expire_uploads=True)
    result, _, _ = await _run(kit, "demo-queue", {"prompt": "two", **params})
    assert result.files
    stats = await kit.demo.stats()
    assert stats["uploads"] == 2 and stats["jobs_created"] == 2
    # A vendor that expires every id at once: one more upload, then the task fails.
    await kit.demo.mode(upload_ttl_s=0, expire_uploads=True)
    with pytest.raises(PermanentError, match="no such file"):
        await _run(kit, "demo-queue", {"prompt": "three", **params})
    stats = await kit.demo.stats()
    assert stats["uploads"] == 3 and stats["jobs_created"] == 2


async def test_a_path_outside_the_input_dirs_is_refused_like_a_missing_one(
    kit: Kit, inputs: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside.png"
    outside.write_bytes(_png("red"))
    messages = set()
    for ref in (str(outside), str(inputs / "missing.png")):
        with pytest.raises(PermanentError) as caught:
            await _run(kit, "demo-queue", {"prompt": "x", "reference_image": ref})
        messages.add(str(caught.value))
    assert len(messages) == 1 and "input dirs" in messages.pop()
    assert (await kit.demo.stats())["uploads"] == 0


async def test_an_http_reference_is_passed_through_or_fetched_from_allowlisted_hosts(
    kit: Kit,
) -> None:
    source = _png("olive", side=1600)
    uploaded = await kit.demo.http.post(
        f"{kit.demo.url}/v1/files",
        files={"file": ("still.png", source, "image/png")},
        headers={"Authorization": "Bearer test-key"},
    )
    url = f"{kit.demo.url}/v1/files/{uploaded.json()['id']}/content"
    # {reference_image:url}: the vendor gets the URL itself.
    profile = _with_body(kit.profiles["demo-queue"], image_url="{reference_image:url}")
    await _run(kit, "demo-queue", {"prompt": "as is", "reference_image": url}, profile)
    # Multipart needs the bytes: fetched through the lane's client, then prepared.
    await _run(kit, "demo-video", {"prompt": "fetched", "reference_image": url})
    api = kit.profiles["demo-video"].api
    assert api is not None
    prepared = prepare(source, api.references, "reference_image")
    assert sorted((await kit.demo.stats())["reference_hashes"].values()) == sorted(
        [["url:" + url], [prepared.sha256]]
    )
    # A host no profile names is never contacted.
    foreign = url.replace("127.0.0.1", "localhost")
    with pytest.raises(PermanentError, match="not the host of any loaded profile"):
        await _run(kit, "demo-video", {"prompt": "foreign", "reference_image": foreign})
    assert (await kit.demo.stats())["submits"] == 2


async def test_a_failed_upload_is_retried_in_place_and_the_submit_sent_once(
    kit: Kit, inputs: Path
) -> None:
    (inputs / "hero.png").write_bytes(_png("navy"))
    await kit.demo.mode(mode="5xx", status=503, only="upload", count=2)
    result, _, _ = await _run(kit, "demo-queue", {"prompt": "p", "reference_image": "hero.png"})
    assert result.files
    stats = await kit.demo.stats()
    assert stats["faults"] == 2 and stats["uploads"] == 1
    assert stats["submits"] == 1 and stats["jobs_created"] == 1
