"""The demo web model over plain HTTP: login, streaming, one generation per session."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from demo.web_model import (
    COLLISION_ERROR,
    DemoState,
    plan_answer,
    start_demo_web,
    tiny_png,
)

SCALE = 0.05
Events = list[tuple[str, dict[str, Any]]]


@pytest.fixture
async def site() -> AsyncIterator[httpx.AsyncClient]:
    server = await start_demo_web(time_scale=SCALE)
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=10) as client:
            yield client
    finally:
        await server.stop()


async def login(site: httpx.AsyncClient, user: str = "ops") -> dict[str, str]:
    """Log in; the headers that carry the session (the client keeps no cookies)."""
    response = await site.post("/login", data={"username": user, "password": "pw"})
    assert response.status_code == 303
    site.cookies.clear()
    return {"Cookie": f"demo_session={response.cookies['demo_session']}"}


async def generate(site: httpx.AsyncClient, session: dict[str, str], text: str) -> Events:
    events: Events = []
    async with site.stream(
        "POST", "/api/generate", json={"text": text}, headers=session
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        async for line in response.aiter_lines():
            if line.startswith("event: "):
                name = line[len("event: ") :]
            elif line.startswith("data: "):
                events.append((name, json.loads(line[len("data: ") :])))
    return events


def answer_of(events: Events) -> str:
    return "".join(data["text"] for name, data in events if name == "chunk")


async def stats(site: httpx.AsyncClient) -> dict[str, Any]:
    data: dict[str, Any] = (await site.get("/__stats")).json()
    return data


async def until_active(site: httpx.AsyncClient, count: int) -> None:
    deadline = time.monotonic() + 10
    while (await stats(site))["active"] != count:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)


def test_the_answer_shows_which_instructions_came_first() -> None:
    state = DemoState(time_scale=1.0)
    brief = plan_answer("Answer briefly.\n\nhello  there", state)
    assert brief.answer == "(brief) echo: hello there"
    assert plan_answer("Think step by step.\n\nhi", state).answer == "(step by step) echo: hi"
    plan = plan_answer("hi [duration=2.5] [media=image,video] [mode=error]", state)
    assert (plan.answer, plan.duration_s, plan.media, plan.mode) == (
        "echo: hi",
        2.5,
        ("image", "video"),
        "error",
    )
    state.mode = "slow"
    assert plan_answer("hi [duration=2]", state).duration_s == 10.0


def test_the_png_is_a_real_png() -> None:
    data = tiny_png(42)
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and data.endswith(b"IEND\xaeB`\x82")


async def test_login_sets_a_persistent_http_only_cookie(site: httpx.AsyncClient) -> None:
    page = (await site.get("/chat")).text
    assert 'id="login-form"' in page and 'id="composer"' not in page
    assert (await site.post("/login", data={"username": "", "password": "x"})).status_code == 400

    response = await site.post("/login", data={"username": "ops", "password": "pw"})
    assert response.status_code == 303 and response.headers["location"] == "/chat"
    cookie = response.headers["set-cookie"].lower()
    assert "httponly" in cookie and "max-age=2592000" in cookie

    session = {"Cookie": f"demo_session={response.cookies['demo_session']}"}
    site.cookies.clear()
    page = (await site.get("/chat", headers=session)).text
    assert 'id="composer"' in page and "<textarea" in page
    assert 'id="send"' in page and 'id="stop" type="button" hidden' in page
    assert (await stats(site))["logins"] == 1


async def test_a_generation_streams_the_answer_over_its_duration(site: httpx.AsyncClient) -> None:
    assert (await site.post("/api/generate", json={"text": "x"})).status_code == 401
    session = await login(site)
    started = time.monotonic()
    events = await generate(site, session, "Answer briefly.\n\nhello there [duration=10]")
    elapsed = time.monotonic() - started
    # 10 nominal seconds at scale 0.05 (0.5 s); unscaled, it would take 10 s.
    assert 0.4 < elapsed < 10
    assert events[0][0] == "start" and events[-1][0] == "done"
    assert answer_of(events) == "(brief) echo: hello there"
    assert (await stats(site))["generations"] == 1


async def test_two_generations_in_one_session_break_each_other(site: httpx.AsyncClient) -> None:
    session = await login(site)
    other = await login(site, "someone-else")
    first = asyncio.create_task(generate(site, session, "one [duration=20]"))
    await until_active(site, 1)
    separate = asyncio.create_task(generate(site, other, "elsewhere [duration=4]"))
    second = await generate(site, session, "two")
    for events in (await first, second):
        assert events[-1] == ("error", {"message": COLLISION_ERROR})
    assert (await separate)[-1][0] == "done"  # another session is not affected
    numbers = await stats(site)
    assert (numbers["generations"], numbers["collisions"], numbers["active"]) == (3, 1, 0)


async def test_stop_ends_the_generation(site: httpx.AsyncClient) -> None:
    session = await login(site)
    running = asyncio.create_task(generate(site, session, "long [duration=100]"))
    await until_active(site, 1)
    assert (await site.post("/api/stop", headers=session)).json() == {"stopped": True}
    events = await running
    assert events[-1][0] == "stopped"
    assert (await site.post("/api/stop", headers=session)).json() == {"stopped": False}
    assert (await stats(site))["stops"] == 1


async def test_errors_on_demand(site: httpx.AsyncClient) -> None:
    session = await login(site)
    events = await generate(site, session, "boom [mode=error]")
    assert events[-1][0] == "error" and "overloaded" in events[-1][1]["message"]
    assert (await generate(site, session, "fine"))[-1][0] == "done"

    await site.post("/__mode", json={"mode": "error", "message": "quota"})
    assert (await generate(site, session, "x"))[-1] == ("error", {"message": "quota"})
    assert (await site.post("/__mode", json={"mode": "nope"})).status_code == 400


async def test_expired_ends_every_session_until_reset(site: httpx.AsyncClient) -> None:
    session = await login(site)
    await site.post("/__mode", json={"mode": "expired"})
    assert 'id="login-form"' in (await site.get("/chat", headers=session)).text
    response = await site.post("/api/generate", json={"text": "x"}, headers=session)
    assert response.status_code == 401
    assert (await stats(site))["mode"] == "expired"

    await site.post("/__reset")
    assert 'id="composer"' in (await site.get("/chat", headers=session)).text
    assert (await stats(site)) == {
        "generations": 0,
        "collisions": 0,
        "logins": 0,
        "stops": 0,
        "mode": "normal",
        "active": 0,
        "reference_hashes": [],
    }


async def test_media_files_are_served_to_the_session(site: httpx.AsyncClient) -> None:
    session = await login(site)
    events = await generate(site, session, "draw [media=image,video]")
    media = [data for name, data in events if name == "media"]
    assert [m["kind"] for m in media] == ["image", "video"]

    image = await site.get(media[0]["src"], headers=session)
    assert image.headers["content-type"] == "image/png"
    assert image.content.startswith(b"\x89PNG")
    video = await site.get(media[1]["src"], headers=session)
    assert video.headers["content-type"] == "video/mp4" and video.content[4:8] == b"ftyp"
    assert (await site.get(media[0]["src"])).status_code == 401


async def test_a_hung_generation_holds_the_session_until_the_client_goes(
    site: httpx.AsyncClient,
) -> None:
    session = await login(site)
    async with site.stream(
        "POST", "/api/generate", json={"text": "freeze [mode=hang]"}, headers=session
    ) as response:
        async for line in response.aiter_lines():
            if line == "event: hang":
                break
        assert (await stats(site))["active"] == 1
    await until_active(site, 0)  # the hung generation ends with its connection
