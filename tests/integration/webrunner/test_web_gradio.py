"""The web runner against real gradio apps (issue 27), from the example profiles.

`tests/gradio_apps/serve.py` serves a streaming chat and a text-to-image
Blocks app with seed and size controls on one loopback port, in a process
of its own for the module (gradio imports in seconds, and must not share the
tests' warnings filter). The profiles are `profiles/examples/gradio-*.toml`
as shipped: exact text, byte-exact images, no answer given to another task.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import pytest_asyncio

from demo.api_media import png_bytes
from dispatcher.clock import SystemClock
from dispatcher.models import Kind, Task, new_id
from dispatcher.profiles import load_profiles
from tests.gradio_apps.common import image_key
from tests.gradio_apps.process import GradioProcess

if TYPE_CHECKING:
    from tests.integration.webrunner.conftest import WebEnv

pytestmark = [pytest.mark.browser, pytest.mark.asyncio(loop_scope="session")]

EXAMPLES = Path("profiles/examples")
ACCOUNT = "gradio-1"
# Real seconds gradio gets to import and serve (~3 s quiet, far more when busy).
START_S = 240.0


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def gradio_url() -> AsyncIterator[str]:
    app = GradioProcess("serve")
    try:
        await app.until_serving("/image/", START_S)
        yield app.url
    finally:
        app.stop()


def _use_examples(web: WebEnv, url: str) -> None:
    web.profiles = load_profiles(
        EXAMPLES, {"GRADIO_CHAT_URL": f"{url}/chat/", "GRADIO_IMAGE_URL": f"{url}/image/"}
    )
    # Real time: the profiles' stable_ms and timeouts are the ones shipped.
    web.clock = SystemClock(1.0)


def _task(model: str, **params: object) -> Task:
    task_id = new_id()
    return Task(
        id=task_id,
        model=model,
        kind=Kind.WEB,
        queue=f"web:{model}",
        params=dict(params),
        fingerprint=f"fp-{task_id}",
        created_at=0.0,
    )


async def test_the_gradio_chat_streams_exact_answers_one_per_task(
    web: WebEnv, gradio_url: str
) -> None:
    _use_examples(web, gradio_url)
    runner = await web.runner()
    prompts = ["first light over the bay", "a second, different question", "3 & <three>"]
    for prompt in prompts:
        task = _task("gradio-chat", prompt=prompt)
        result = await runner.run(task, web.context(task, account=ACCOUNT)[0])
        # The pause after the first word did not end the answer early.
        assert result.text == f"echo: {prompt}"
        assert result.files == []
    assert runner.counts["browser_launches"] == 1


async def test_the_gradio_image_app_draws_byte_exact_images_from_seed_and_size(
    web: WebEnv, gradio_url: str
) -> None:
    _use_examples(web, gradio_url)
    runner = await web.runner()
    digests = set()
    for prompt, seed, size in [("a fox", 1, 32), ("a fox", 2, 32), ("a heron", 1, 96)]:
        task = _task("gradio-image", prompt=prompt, seed=seed, size=size)
        result = await runner.run(task, web.context(task, account=ACCOUNT)[0])
        assert result.text is None, "an image-only answer stores no text"
        assert len(result.files) == 1
        data = Path(result.files[0].path).read_bytes()
        assert data == png_bytes(image_key(prompt, seed, size), side=size)
        digests.add(hashlib.sha256(data).hexdigest())
    assert len(digests) == 3
