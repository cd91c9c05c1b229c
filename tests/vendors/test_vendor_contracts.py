"""Every catalog profile (profiles/vendors/) through the real service against
its vendor's stand-in: submit, poll, download; and, where the vendor
documents it, a refusal that is not retried, a 429 whose Retry-After holds
the lane, a cancel that reaches the vendor, and a restart that resumes the
remote job without a second submit. One service for the module."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

import httpx
import pytest
import pytest_asyncio

from dispatcher.service.serving import RunningServer
from dispatcher.settings import Settings
from tests.support.harness import Harness, serving
from tests.support.helpers import REPO
from tests.vendors.catalog_a import VENDORS_A
from tests.vendors.catalog_b import KLING_SECRET, VENDORS_B, verify_hs256
from tests.vendors.standin import BASE_ENV, KEY, MP4, PNG, StandInState, start_standin

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(120)]

SCALE = 0.01
CATALOG = REPO / "profiles" / "vendors"

# profile -> (vendor stand-in, task params as the vendor's reference takes them)
PROFILES: dict[str, tuple[str, dict[str, Any]]] = {
    "openai-sora-2": ("openai", {"seconds": "4", "size": "720x1280"}),
    "openai-sora-2-pro": ("openai", {"seconds": "8", "size": "1280x720"}),
    "openai-gpt-image-1": ("openai", {"size": "1024x1024", "quality": "low"}),
    "openai-gpt-4-1-mini": ("openai", {"seed": 3, "temperature": 0.2}),
    "gemini-veo-3": ("gemini", {"aspect_ratio": "16:9", "negative_prompt": "blur"}),
    "gemini-imagen-4": ("gemini", {"aspect_ratio": "1:1"}),
    "runway-gen4-5": ("runway", {"ratio": "1280:720", "duration": 5}),
    "luma-ray-2": ("luma", {"aspect_ratio": "16:9", "resolution": "720p", "duration": "5s"}),
    "replicate-flux-schnell": ("replicate", {"aspect_ratio": "1:1", "seed": 7}),
    "fal-kling-video": ("fal", {"duration": "5", "aspect_ratio": "16:9"}),
    "kling-v2-1": ("kling", {"duration": "5", "aspect_ratio": "16:9", "mode": "std"}),
    "minimax-hailuo-02": ("minimax", {"duration": 6, "resolution": "768P"}),
    "dashscope-wan-2-2": ("dashscope", {"size": "1920*1080", "duration": 5}),
    "ark-seedance-1-0-pro": ("ark", {}),
}
KEY_ENV = (
    "OPENAI_API_KEY",
    "GEMINI_API_KEY",
    "RUNWAYML_API_SECRET",
    "LUMAAI_API_KEY",
    "REPLICATE_API_TOKEN",
    "FAL_KEY",
    "KLING_ACCESS_KEY",
    "MINIMAX_API_KEY",
    "DASHSCOPE_API_KEY",
    "ARK_API_KEY",
)
# Vendors that say "refused" in a way the profile reads (MiniMax too: a failed job).
REFUSING = [
    p
    for p in PROFILES
    if p
    not in ("openai-sora-2-pro", "gemini-imagen-4", "openai-gpt-image-1", "openai-gpt-4-1-mini")
]


@dataclass
class World:
    h: Harness
    state: StandInState
    server: RunningServer
    profiles: Path
    root: Path


def settings_for(root: Path, profiles: Path, state_dir: Path) -> Settings:
    return Settings(state_dir=state_dir, profiles_dir=profiles, time_scale=SCALE)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def world(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[World]:
    root = tmp_path_factory.mktemp("vendors")
    profiles = root / "profiles"
    profiles.mkdir()
    for name in PROFILES:
        shutil.copy(CATALOG / f"{name}.toml", profiles / f"{name}.toml")
    server, state = await start_standin([*VENDORS_A, *VENDORS_B])
    with pytest.MonkeyPatch.context() as env:
        for vendor, var in BASE_ENV.items():
            env.setenv(var, f"{server.url}/{vendor}")
        for var in KEY_ENV:
            env.setenv(var, KEY)
        env.setenv("KLING_SECRET_KEY", KLING_SECRET)
        try:
            async with serving(settings_for(root, profiles, root / "state")) as h:
                yield World(h, state, server, profiles, root)
        finally:
            await server.stop()


def sent(world: World, vendor: str, since: int) -> list[Any]:
    return [s for s in world.state.seen[since:] if s.vendor == vendor]


@pytest.mark.parametrize("profile", list(PROFILES))
async def test_submit_poll_download(world: World, profile: str) -> None:
    vendor, params = PROFILES[profile]
    mark, jobs = len(world.state.seen), world.state.submits(vendor)
    task = await world.h.submit(profile, f"a lighthouse at dusk for {profile}", **params)
    done = await world.h.wait_task(task["id"])
    assert done["state"] == "success", done
    if profile == "openai-gpt-4-1-mini":
        assert done["result"]["text"] == f"An answer to: a lighthouse at dusk for {profile}"
    else:
        [result] = done["result"]["files"]
        data = Path(result["path"]).read_bytes()
        assert data in (MP4, PNG)
    assert world.state.submits(vendor) == jobs + 1
    requests = sent(world, vendor, mark)
    submit = requests[0]
    assert submit.method == "POST"
    # The key reached the vendor the way its reference says, on every call
    # to its API (a signed file URL needs none).
    api_calls = [r for r in requests if "/files/" not in r.path and "/cdn/" not in r.path]
    if vendor == "gemini":
        assert all(r.headers["x-goog-api-key"] == KEY for r in api_calls)
    elif vendor == "kling":
        for r in api_calls:
            claims = verify_hs256(r.headers["authorization"][7:], KLING_SECRET, r.wall)
            assert claims is not None and claims["iss"] == KEY
    elif vendor == "fal":
        assert all(r.headers["authorization"] == f"Key {KEY}" for r in api_calls)
    else:
        assert submit.headers["authorization"] == f"Bearer {KEY}"
    if vendor == "runway":
        assert all(r.headers["x-runway-version"] == "2024-11-06" for r in api_calls)
    if vendor == "dashscope":
        assert submit.headers["x-dashscope-async"] == "enable"
        assert all("x-dashscope-async" not in r.headers for r in requests[1:])
    if vendor == "minimax":
        assert any(r.path == "/v1/files/retrieve" for r in requests)


@pytest.mark.parametrize("profile", REFUSING)
async def test_refusal_is_permanent_and_not_retried(world: World, profile: str) -> None:
    vendor, params = PROFILES[profile]
    jobs = world.state.submits(vendor)
    submits_before = sum(1 for s in world.state.seen if s.vendor == vendor and s.method == "POST")
    task = await world.h.submit(profile, f"REFUSE this {profile}", **params)
    done = await world.h.wait_task(task["id"])
    assert done["state"] == "failed", done
    assert done["error"]["kind"] == "refused", done["error"]
    assert done["attempt"] == 1
    posts = [s for s in world.state.seen if s.vendor == vendor and s.method == "POST"]
    assert world.state.submits(vendor) <= jobs + 1
    assert len(posts) == submits_before + 1  # one submit, never sent again


@pytest.mark.parametrize(
    "profile", ["openai-sora-2", "replicate-flux-schnell", "dashscope-wan-2-2"]
)
async def test_429_retry_after_holds_the_lane(world: World, profile: str) -> None:
    vendor, params = PROFILES[profile]
    mark, jobs = len(world.state.seen), world.state.submits(vendor)
    world.state.throttle[vendor] = 1
    task = await world.h.submit(profile, f"throttled {profile}", **params)
    done = await world.h.wait_task(task["id"])
    assert done["state"] == "success", done
    assert done["attempt"] == 1
    assert world.state.submits(vendor) == jobs + 1
    first, second = [r for r in sent(world, vendor, mark) if r.method == "POST"][:2]
    # Retry-After is the vendor's wall clock: honoured in real seconds.
    assert second.at - first.at >= 1.0


@pytest.mark.parametrize(
    "profile",
    [
        "runway-gen4-5",
        "luma-ray-2",
        "replicate-flux-schnell",
        "fal-kling-video",
        "dashscope-wan-2-2",
        "ark-seedance-1-0-pro",
    ],
)
async def test_cancel_reaches_the_vendor(world: World, profile: str) -> None:
    vendor, params = PROFILES[profile]
    task = await world.h.submit(profile, f"HOLD then cancel {profile}", **params)
    running = await world.h.wait_remote_id(task["id"])
    response = await world.h.http.post(f"/v1/tasks/{task['id']}/cancel")
    assert response.status_code in (200, 202), response.text
    done = await world.h.wait_task(task["id"])
    assert done["state"] == "canceled", done
    remote = running["remote_id"]
    job = next(j for j in world.state.jobs[vendor].values() if j.id in remote)
    for _ in range(200):  # the cancel call follows the task's end
        if job.canceled:
            break
        await asyncio.sleep(0.01)
    assert job.canceled


@pytest.mark.parametrize("profile", ["fal-kling-video", "gemini-veo-3", "minimax-hailuo-02"])
async def test_restart_resumes_without_a_second_submit(world: World, profile: str) -> None:
    vendor, params = PROFILES[profile]
    state_dir = world.root / f"restart-{profile}"
    settings = settings_for(world.root, world.profiles, state_dir)
    jobs = world.state.submits(vendor)
    world.state.hold = True
    async with serving(settings) as first:
        task = await first.submit(profile, f"HOLD across a restart {profile}", **params)
        await first.wait_remote_id(task["id"])
    world.state.hold = False
    try:
        async with serving(settings) as second:
            done = await second.wait_task(task["id"])
    finally:
        world.state.hold = True
    assert done["state"] == "success", done
    assert world.state.submits(vendor) == jobs + 1


async def test_an_error_sent_with_http_200_is_classified_by_its_code(world: World) -> None:
    """MiniMax's rate limit is a 200 with base_resp.status_code 1002: retried in place."""
    jobs = world.state.submits("minimax")
    world.state.throttle["minimax"] = 1
    task = await world.h.submit("minimax-hailuo-02", "a 200 that is a 429", duration=6)
    done = await world.h.wait_task(task["id"])
    assert done["state"] == "success", done
    assert done["attempt"] == 1
    assert world.state.submits("minimax") == jobs + 1


async def test_an_exhausted_rate_limit_window_holds_the_lane_until_it_resets(
    world: World,
) -> None:
    """x-ratelimit-remaining-requests: 0 on a success: no request before the reset."""
    mark = len(world.state.seen)
    world.state.window["openai"] = ("0", "1s")
    try:
        task = await world.h.submit("openai-sora-2", "a window spent", seconds="4")
        await world.h.wait_remote_id(task["id"])
    finally:
        world.state.window.pop("openai")
    done = await world.h.wait_task(task["id"])
    assert done["state"] == "success", done
    submit, first_poll = sent(world, "openai", mark)[:2]
    assert first_poll.at - submit.at >= 1.0


async def test_a_spent_quota_fails_the_task_and_holds_the_lane(world: World) -> None:
    world.state.spent.add("openai")
    try:
        task = await world.h.submit("openai-gpt-image-1", "no credit left")
        done = await world.h.wait_task(task["id"], states={"failed", "pending"})
        accounts = (await world.h.http.get("/v1/accounts")).json()
    finally:
        world.state.spent.discard("openai")
    lane = next(a for a in accounts if a["name"] == "openai")
    assert lane["needs_attention"], lane
    assert "quota" in lane["reason"], lane
    (await world.h.http.post("/v1/accounts/openai/enable")).raise_for_status()
    done = await world.h.wait_task(task["id"])
    assert done["state"] == "success", done


async def test_a_missing_secret_shows_on_the_provider_by_its_variable(world: World) -> None:
    """A signed-token profile needs its secret too: without it the lane needs attention."""

    async def kling() -> dict[str, Any]:
        accounts = (await world.h.http.get("/v1/accounts")).json()
        return dict(next(a for a in accounts if a["name"] == "kling"))

    secret = os.environ.pop("KLING_SECRET_KEY")
    try:
        await world.h.service.check_api_keys()
        lane = await kling()
    finally:
        os.environ["KLING_SECRET_KEY"] = secret
    assert lane["needs_attention"] and "KLING_SECRET_KEY" in lane["reason"], lane
    await world.h.service.check_api_keys()
    assert not (await kling())["needs_attention"]


# OpenAI's published document, kept in the repository (tests/vendors/specs/README.md).
OPENAI_SPEC = Path(__file__).resolve().parent / "specs" / "openai-openapi.yaml"


def openai_document() -> Any:
    """OpenAI's published OpenAPI document, loaded once (it is large)."""
    import yaml
    from openapi_core import Config, OpenAPI

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with OPENAI_SPEC.open(encoding="utf-8") as f:
        spec = yaml.load(f, Loader=loader)  # a safe loader (C when built)
    # Its message union names a discriminator (`role`) without a mapping, so a
    # validator looks for a schema named after the value ("user"): give the
    # mapping the union's own members imply.
    message = spec["components"]["schemas"]["ChatCompletionRequestMessage"]
    message["discriminator"].setdefault(
        "mapping",
        {
            role: f"#/components/schemas/ChatCompletionRequest{role.title()}Message"
            for role in ("developer", "system", "user", "assistant", "tool", "function")
        },
    )
    # The document repeats some `required` names, which the spec check refuses;
    # the request and answer schemas themselves are what we validate against.
    return OpenAPI.from_dict(spec, config=Config(spec_validator_cls=None))


async def test_openai_requests_and_answers_match_the_openapi_document(world: World) -> None:
    from openapi_core.testing import MockRequest, MockResponse

    mark = len(world.state.seen)
    ids = []
    for profile in (
        "openai-sora-2",
        "openai-sora-2-pro",
        "openai-gpt-image-1",
        "openai-gpt-4-1-mini",
    ):
        _, params = PROFILES[profile]
        task = await world.h.submit(profile, f"checked against the document: {profile}", **params)
        ids.append(task["id"])
    for task_id in ids:
        assert (await world.h.wait_task(task_id))["state"] == "success"
    document = await asyncio.to_thread(openai_document)
    checked = 0
    async with httpx.AsyncClient() as client:
        for request in sent(world, "openai", mark):
            mock = MockRequest(
                "https://api.openai.com",
                request.method.lower(),
                request.path,
                args=dict(parse_qsl(request.query)),
                data=request.body or None,
                headers=request.headers,
                content_type=request.headers.get("content-type", "application/json"),
            )
            document.validate_request(mock)  # raises, naming the field, when we drift
            # And the stand-in's answer to the same call against the document's schema.
            if request.path.endswith("/content"):
                continue
            again = await client.request(
                request.method,
                f"{world.server.url}/openai{request.path}",
                content=request.body,
                headers={k: v for k, v in request.headers.items() if k != "content-length"},
            )
            document.validate_response(
                mock,
                MockResponse(
                    again.content,
                    status_code=again.status_code,
                    content_type=again.headers["content-type"],
                ),
            )
            checked += 1
    assert checked >= 5
