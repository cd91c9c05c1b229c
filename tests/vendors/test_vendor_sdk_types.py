"""The stand-ins' answers parse with each vendor's official SDK types: if a
stand-in drifts from its vendor, the vendor's own models reject it (and
the contract tests would be checking the dispatcher against a fiction).

Kling, MiniMax, DashScope and Ark publish no Python SDK with answer types
here; their stand-ins follow the API references alone (docs/vendors.md)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio
from pydantic import TypeAdapter

from tests.vendors.catalog_a import VENDORS_A
from tests.vendors.catalog_b import VENDORS_B
from tests.vendors.standin import KEY, StandInState, start_standin

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(60)]

BEARER = {"Authorization": f"Bearer {KEY}"}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def standin() -> AsyncIterator[tuple[httpx.AsyncClient, StandInState]]:
    server, state = await start_standin([*VENDORS_A, *VENDORS_B])
    try:
        async with httpx.AsyncClient(base_url=server.url) as client:
            yield client, state
    finally:
        await server.stop()


async def lifecycle(
    client: httpx.AsyncClient,
    submit: tuple[str, Any],
    status_path: str,
    headers: dict[str, str],
    polls: int = 3,
) -> tuple[Any, list[Any]]:
    """The submit answer and the status answers of a job's life (queued, running, done)."""
    path, body = submit
    answer = await client.post(path, json=body, headers=headers)
    assert answer.status_code in (200, 201), answer.text
    created = answer.json()
    statuses = []
    for _ in range(polls):
        response = await client.get(status_path.format(**_ids(created)), headers=headers)
        assert response.status_code == 200, response.text
        statuses.append(response.json())
    return created, statuses


def _ids(created: Any) -> dict[str, str]:
    if "id" in created:
        return {"id": created["id"]}
    if "name" in created:
        return {"id": created["name"].rpartition("/")[2]}
    return {}


async def test_openai_video_and_image_answers(standin: Any) -> None:
    from openai.types import ImagesResponse, Video
    from openai.types.chat import ChatCompletion

    client, _ = standin
    created, statuses = await lifecycle(
        client,
        ("/openai/v1/videos", {"model": "sora-2", "prompt": "a cat", "seconds": "4"}),
        "/openai/v1/videos/{id}",
        BEARER,
    )
    parsed = [Video.model_validate(a) for a in [created, *statuses]]
    assert [v.status for v in parsed] == ["queued", "queued", "in_progress", "completed"]
    image = await client.post(
        "/openai/v1/images/generations",
        json={"model": "gpt-image-1", "prompt": "a cat"},
        headers=BEARER,
    )
    images = ImagesResponse.model_validate(image.json())
    assert images.data and images.data[0].b64_json
    chat = await client.post(
        "/openai/v1/chat/completions",
        json={"model": "gpt-4.1-mini", "messages": [{"role": "user", "content": "hi"}]},
        headers=BEARER,
    )
    completion = ChatCompletion.model_validate(chat.json())
    assert completion.choices[0].message.content == "An answer to: hi"


async def test_gemini_veo_operation(standin: Any) -> None:
    from google.genai import types

    client, _ = standin
    key = {"x-goog-api-key": KEY}
    body = {"instances": [{"prompt": "a cat"}], "parameters": {"aspectRatio": "16:9"}}
    _, statuses = await lifecycle(
        client,
        ("/gemini/v1beta/models/veo-3.0-generate-001:predictLongRunning", body),
        "/gemini/v1beta/models/veo-3.0-generate-001/operations/{id}",
        key,
    )
    operations = [types.GenerateVideosOperation.from_api_response(a) for a in statuses]
    assert [bool(op.done) for op in operations] == [False, False, True]
    videos = operations[-1].response.generated_videos  # type: ignore[union-attr]
    assert videos and videos[0].video and videos[0].video.uri
    _, statuses = await lifecycle(
        client,
        (
            "/gemini/v1beta/models/veo-3.0-generate-001:predictLongRunning",
            {"instances": [{"prompt": "REFUSE"}]},
        ),
        "/gemini/v1beta/models/veo-3.0-generate-001/operations/{id}",
        key,
    )
    done = types.GenerateVideosOperation.from_api_response(statuses[-1])
    assert done.response and done.response.rai_media_filtered_count == 1


async def test_runway_tasks(standin: Any) -> None:
    from runwayml.types import TaskRetrieveResponse

    client, _ = standin
    headers = {**BEARER, "X-Runway-Version": "2024-11-06"}
    adapter: TypeAdapter[Any] = TypeAdapter(TaskRetrieveResponse)
    for prompt, last in (("a cat", "SUCCEEDED"), ("REFUSE", "FAILED")):
        _, statuses = await lifecycle(
            client,
            ("/runway/v1/text_to_video", {"model": "gen4.5", "promptText": prompt}),
            "/runway/v1/tasks/{id}",
            headers,
        )
        parsed = [adapter.validate_python(a) for a in statuses]
        assert [t.status for t in parsed] == ["PENDING", "RUNNING", last]


async def test_luma_generations(standin: Any) -> None:
    from lumaai.types import Generation

    client, _ = standin
    created, statuses = await lifecycle(
        client,
        ("/luma/dream-machine/v1/generations", {"model": "ray-2", "prompt": "a cat"}),
        "/luma/dream-machine/v1/generations/{id}",
        BEARER,
    )
    parsed = [Generation.model_validate(a) for a in [created, *statuses]]
    assert [g.state for g in parsed] == ["queued", "queued", "dreaming", "completed"]
    assert parsed[-1].assets and parsed[-1].assets.video


async def test_replicate_predictions(standin: Any) -> None:
    from replicate.prediction import Prediction

    client, _ = standin
    created, statuses = await lifecycle(
        client,
        (
            "/replicate/v1/models/black-forest-labs/flux-schnell/predictions",
            {"input": {"prompt": "a cat"}},
        ),
        "/replicate/v1/predictions/{id}",
        BEARER,
    )
    # The SDK models are pydantic v1 (`parse_obj` validates).
    parsed = [Prediction.parse_obj(a) for a in [created, *statuses]]
    assert [p.status for p in parsed] == ["starting", "starting", "processing", "succeeded"]
    assert parsed[-1].output


async def test_fal_queue(standin: Any) -> None:
    from fal_client.client import Completed, InProgress, Queued, _BaseRequestHandle

    client, _ = standin
    headers = {"Authorization": f"Key {KEY}"}
    answer = await client.post(
        "/fal/fal-ai/kling-video/v2.1/standard/text-to-video",
        json={"prompt": "a cat"},
        headers=headers,
    )
    data = answer.json()
    handle = _BaseRequestHandle(
        request_id=data["request_id"],
        response_url=data["response_url"],
        status_url=data["status_url"],
        cancel_url=data["cancel_url"],
    )
    kinds = []
    for _ in range(3):
        status = await client.get(handle.status_url, headers=headers)
        kinds.append(type(handle._parse_status(status.json())))
    assert kinds == [Queued, InProgress, Completed]
