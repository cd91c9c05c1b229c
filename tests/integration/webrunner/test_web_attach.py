"""A web task's reference images are attached on the page before the prompt
(real Chromium against the demo chat page's file input)."""

from __future__ import annotations

import base64
import hashlib
import io
from typing import TYPE_CHECKING

import pytest
from PIL import Image

from dispatcher.errors import PermanentError

if TYPE_CHECKING:
    from tests.integration.webrunner.conftest import WebEnv

pytestmark = [pytest.mark.browser, pytest.mark.asyncio(loop_scope="session")]


def _png(colour: str) -> bytes:
    out = io.BytesIO()
    with Image.new("RGB", (24, 16), colour) as img:
        img.save(out, "PNG")
    return out.getvalue()


async def test_reference_images_are_attached_and_reach_the_page(web: WebEnv) -> None:
    inputs = web.settings.resolved_input_dirs[0]
    inputs.mkdir(parents=True, exist_ok=True)
    first, second = _png("orange"), _png("teal")
    (inputs / "hero.png").write_bytes(first)
    runner = await web.runner()
    before = len((await web.stats())["reference_hashes"])

    task = web.task("describe them")
    task = task.replace(params={**task.params, "reference_images": ["hero.png", _b64(second)]})
    ctx, _ = web.context(task)
    result = await runner.run(task, ctx)
    assert result.text is not None and "describe them" in result.text

    received = (await web.stats())["reference_hashes"][before:]
    assert received == [hashlib.sha256(first).hexdigest(), hashlib.sha256(second).hexdigest()]

    # A page that cannot take files says so instead of generating without them.
    plain = web.task("no files here", model="demo-reasoner")
    plain = plain.replace(params={**plain.params, "reference_image": "hero.png"})
    ctx, _ = web.context(plain)
    with pytest.raises(PermanentError, match="cannot take reference images"):
        await runner.run(plain, ctx)


def _b64(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()
