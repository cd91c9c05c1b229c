"""A hostile vendor against the whole service: what is stored, what is sent, how often.

The API runner's own tests (tests/integration/apirunner/test_api_hostile_vendor.py)
cover every shape; these run a few through the real scheduler and SQLite
store, where a crash would turn into a retry and a secret into a stored row.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from demo.hostile import start_hostile
from dispatcher.service import Service
from dispatcher.serving import RunningServer
from dispatcher.settings import Settings

KEY = "sk-hostile-" + "7" * 32
SCALE = 0.02

_PROFILE = """
name = "hostile-{shape}"
kind = "api"
provider = "hostile"
max_attempts = 3

[api]
base_url = "${{HOSTILE_URL}}"
auth_header = "X-Api-Key"
auth_env = "HOSTILE_SERVICE_KEY"
auth_prefix = ""
style = "async-job"
timeout_s = 600

[api.submit]
method = "POST"
path = "/{shape}/jobs"
body = {{ prompt = "{{prompt}}" }}
id = "id"

[api.status]
path = "/{shape}/jobs/{{id}}/status"
state = "status"

[api.result]
path = "/{shape}/jobs/{{id}}/content"
"""

SHAPES = ("plain", "key_echo", "nested_submit", "nested", "longname")


@pytest.fixture
async def vendor(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[RunningServer]:
    monkeypatch.setenv("HOSTILE_SERVICE_KEY", KEY)
    server = await start_hostile()
    monkeypatch.setenv("HOSTILE_URL", server.url)
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
async def service(tmp_path: Path, vendor: RunningServer) -> AsyncIterator[httpx.AsyncClient]:
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    for shape in SHAPES:
        (profiles / f"hostile-{shape}.toml").write_text(_PROFILE.format(shape=shape))
    settings = Settings(
        state_dir=tmp_path / "state",
        profiles_dir=profiles,
        time_scale=SCALE,
        retry_delay_s=0.0,
    )
    service = Service(settings)
    await service.start()
    try:
        async with httpx.AsyncClient(
            base_url=service.url,
            headers={"Authorization": f"Bearer {service.credentials.token}"},
            timeout=30,
        ) as http:
            yield http
    finally:
        await service.stop()


async def _run(http: httpx.AsyncClient, model: str) -> dict[str, Any]:
    answer = await http.post("/v1/tasks", json={"model": model, "params": {"prompt": "hi"}})
    assert answer.status_code in (200, 201), answer.text
    task_id = answer.json()["id"]
    async with asyncio.timeout(30):
        while True:
            task: dict[str, Any] = (await http.get(f"/v1/tasks/{task_id}")).json()
            if task["state"] in ("success", "failed", "canceled"):
                return task
            await asyncio.sleep(0.02)


async def _stats(vendor: RunningServer) -> dict[str, Any]:
    async with httpx.AsyncClient() as http:
        data: dict[str, Any] = (await http.get(f"{vendor.url}/__stats")).json()
    return data


async def test_a_key_echoed_by_the_vendor_is_stored_nowhere(
    service: httpx.AsyncClient, vendor: RunningServer, tmp_path: Path
) -> None:
    answer = await service.post(
        "/v1/tasks", json={"model": "hostile-key_echo", "params": {"prompt": "hi"}}
    )
    task_id = answer.json()["id"]
    # A 401 is the key's fault, not the task's: the provider needs attention
    # (with the vendor's words as the reason), the task waits on attempt 1.
    async with asyncio.timeout(30):
        while True:
            providers = (await service.get("/v1/accounts")).json()
            if any(a["state"] == "needs_attention" for a in providers):
                break
            await asyncio.sleep(0.02)
    (provider,) = (a for a in providers if a["state"] == "needs_attention")
    assert "Incorrect API key provided" in provider["reason"]
    assert KEY not in str(providers)
    task = (await service.get(f"/v1/tasks/{task_id}")).json()
    assert (task["state"], task["attempt"]) == ("pending", 1)
    assert KEY not in str(task)
    # The vendor did receive it (the key is real), once: one submit.
    stats = await _stats(vendor)
    assert stats["submits"] == {"key_echo": 1}
    assert stats["requests"][0]["headers"]["x-api-key"] == KEY
    stored = b"".join(p.read_bytes() for p in (tmp_path / "state").glob("dispatcher.db*"))
    assert stored, "no SQLite file found"
    assert KEY.encode() not in stored


@pytest.mark.parametrize(
    ("shape", "state", "kind"),
    [
        ("nested_submit", "failed", "bad_answer"),
        ("nested", "failed", "bad_answer"),
        ("longname", "success", None),
    ],
)
async def test_a_hostile_answer_costs_one_submit_through_the_scheduler(
    service: httpx.AsyncClient, vendor: RunningServer, shape: str, state: str, kind: str | None
) -> None:
    task = await _run(service, f"hostile-{shape}")
    assert task["state"] == state, task
    assert task["attempt"] == 1
    assert (task["error"] or {}).get("kind") == kind
    assert (await _stats(vendor))["submits"] == {shape: 1}
