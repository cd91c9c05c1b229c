"""Reference-image preparation and the prepared/upload caches."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path

import pytest
from PIL import Image

from apirunner.refsend import image_needs
from dispatcher.clock import FakeClock
from dispatcher.errors import InputError
from dispatcher.profile_calls import ReferenceSpec
from dispatcher.profiles import ApiSpec
from dispatcher.refimages import PreparedImages, UploadCache, prepare
from dispatcher.tasks.fingerprint import LocalFiles


def _image(fmt: str, size: tuple[int, int], mode: str = "RGB") -> bytes:
    out = io.BytesIO()
    with Image.effect_noise(size, 60).convert(mode) as img:
        img.save(out, fmt)
    return out.getvalue()


def test_an_image_that_already_fits_is_sent_byte_for_byte() -> None:
    data = _image("PNG", (100, 50))
    prepared = prepare(data, ReferenceSpec(max_edge_px=200, format="png"), "reference_image")
    assert prepared.data == data and prepared.mime == "image/png"


def test_preparation_scales_the_long_edge_and_re_encodes() -> None:
    data = _image("PNG", (800, 400), "RGBA")
    prepared = prepare(data, ReferenceSpec(max_edge_px=200, format="jpeg"), "reference_image")
    assert prepared.mime == "image/jpeg" and prepared.data_url.startswith("data:image/jpeg;")
    with Image.open(io.BytesIO(prepared.data)) as img:
        assert (img.format, img.size) == ("JPEG", (200, 100))


def test_max_bytes_shrinks_until_it_fits_or_says_why() -> None:
    data = _image("PNG", (600, 600))
    prepared = prepare(data, ReferenceSpec(max_bytes=40_000), "reference_image")
    assert len(prepared.data) <= 40_000
    with pytest.raises(InputError, match=r"^reference_image: not (a readable image|an image)"):
        prepare(b"\x89PNG\r\n\x1a\nbroken", ReferenceSpec(), "reference_image")


async def test_a_picture_is_prepared_once_for_every_task(tmp_path: Path) -> None:
    (tmp_path / "a.png").write_bytes(_image("PNG", (400, 300)))
    files = LocalFiles.under([tmp_path], 10**7)
    cache = PreparedImages()
    spec = ReferenceSpec(max_edge_px=100)
    results = await asyncio.gather(
        *(cache.get("a.png", "reference_image", files, spec) for _ in range(5))
    )
    assert cache.prepared == 1 and len({r.sha256 for r in results}) == 1
    await cache.get("a.png", "reference_image", files, ReferenceSpec(max_edge_px=50))
    assert cache.prepared == 2  # another preparation is another image


async def test_one_upload_in_flight_serves_every_waiter_until_its_ttl() -> None:
    clock = FakeClock()
    cache = UploadCache(clock)
    image = prepare(_image("PNG", (20, 20)), ReferenceSpec(), "reference_image")
    started = asyncio.Event()
    release = asyncio.Event()
    calls = 0

    async def upload() -> str:
        nonlocal calls
        calls += 1
        started.set()
        await release.wait()
        return f"file_{calls}"

    waiters = [asyncio.ensure_future(cache.get("/v1/files", image, 60, upload)) for _ in range(4)]
    await started.wait()
    release.set()
    answers = await asyncio.gather(*waiters)
    assert calls == 1 and {value for value, _ in answers} == {"file_1"}
    assert sum(made for _, made in answers) == 1
    clock.advance(61)
    assert await cache.get("/v1/files", image, 60, upload) == ("file_2", True)
    cache.forget("/v1/files", image, "file_1")  # a stale refusal forgets nothing newer
    assert await cache.get("/v1/files", image, 60, upload) == ("file_2", False)


def _spec(body: dict[str, object]) -> ApiSpec:
    return ApiSpec.model_validate(
        {
            "base_url": "https://vendor.example",
            "style": "async-job",
            "submit": {"method": "POST", "path": "/jobs", "id": "id", "body": body},
            "status": {"path": "/jobs/{id}"},
        }
    )


def test_each_spec_gets_its_own_image_forms_every_time() -> None:
    # Asked by every attempt (and remembered per spec): a caller's set is its
    # own, and a reloaded profile's body is read anew.
    first = _spec({"image": "{reference_image:base64}"})
    needs = image_needs(first)
    assert needs == {("reference_image", "base64")}
    needs.clear()
    assert image_needs(first) == {("reference_image", "base64")}
    reloaded = _spec({"image": "{reference_image:data_url}"})
    assert image_needs(reloaded) == {("reference_image", "data_url")}
    assert image_needs(_spec({"prompt": "{prompt}"})) == set()
