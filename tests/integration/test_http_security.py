"""The local API's guards, against the real service on a free port."""

from __future__ import annotations

import stat
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from demo.bootstrap import Demo
from dispatcher.errors import ConfigError, LockHeld
from dispatcher.service.core import Service
from dispatcher.settings import Settings
from tests.support.harness import profiles_dir, running_service


async def test_token_required_and_compared(tmp_path: Path) -> None:
    async with running_service(tmp_path) as h, httpx.AsyncClient(base_url=h.service.url) as anon:
        missing = await anon.get("/v1/lanes")
        assert missing.status_code == 401
        assert "token" in missing.json()["error"]["message"]
        wrong = await anon.get("/v1/lanes", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 403
        token = h.service.credentials.token
        ok = await anon.get("/v1/lanes", headers={"X-Local-Token": token})
        assert ok.status_code == 200
        ok = await anon.get("/v1/lanes", headers={"Authorization": f"Bearer {token}"})
        assert ok.status_code == 200


async def test_host_header_must_be_loopback(tmp_path: Path) -> None:
    async with running_service(tmp_path) as h:
        response = await h.http.get("/v1/lanes", headers={"Host": "evil.example:8080"})
        assert response.status_code == 403
        assert "loopback" in response.json()["error"]["message"]
        assert h.service.http is not None
        response = await h.http.get(
            "/v1/lanes", headers={"Host": f"localhost:{h.service.http.port}"}
        )
        assert response.status_code == 200


async def test_oversized_body_gets_413_and_creates_nothing(tmp_path: Path) -> None:
    async with running_service(tmp_path) as h:
        big = {"model": "demo-chat-api", "params": {"prompt": "x" * (1024 * 1024 + 10)}}
        response = await h.http.post("/v1/tasks", json=big)
        assert response.status_code == 413

        async def chunks() -> AsyncIterator[bytes]:
            for _ in range(20):
                yield b"x" * 65536

        response = await h.http.post("/v1/tasks", content=chunks())
        assert response.status_code == 413
        assert await h.service.store.state_counts() == {}


@pytest.mark.parametrize(
    ("body", "status", "fragment"),
    [
        (b"{not json", 400, "not valid JSON"),
        (b"[]", 400, "JSON object"),
        (b'{"model": "no-such-model", "params": {}}', 400, "unknown model"),
        (b'{"model": "demo-chat-api", "params": "hi"}', 400, "params must be a JSON object"),
        (b'{"model": "demo-chat-api", "params": {"prompt": 5}}', 400, "prompt must be a string"),
        (b'{"model": "demo-chat-api", "colour": "red"}', 400, "unknown field"),
        (b"", 400, "empty"),
    ],
)
async def test_bad_input_gets_a_clear_4xx(
    tmp_path: Path, body: bytes, status: int, fragment: str
) -> None:
    async with running_service(tmp_path) as h:
        response = await h.http.post(
            "/v1/tasks", content=body, headers={"Content-Type": "application/json"}
        )
        assert response.status_code == status
        assert fragment in response.json()["error"]["message"]


async def test_bad_job_line_rejects_the_whole_job(tmp_path: Path) -> None:
    async with running_service(tmp_path) as h:
        response = await h.http.post(
            "/v1/jobs",
            json={
                "name": "j",
                "tasks": [
                    {"model": "demo-chat-api", "params": {"prompt": "fine"}},
                    {"model": "nope", "params": {}},
                ],
            },
        )
        assert response.status_code == 400
        assert "tasks[1]" in response.json()["error"]["message"]
        assert "unknown model" in response.json()["error"]["message"]
        assert await h.service.store.state_counts() == {}


async def test_unknown_ids_are_404_and_conflicts_409(tmp_path: Path) -> None:
    async with running_service(tmp_path) as h:
        assert (await h.http.get("/v1/tasks/nope")).status_code == 404
        assert (await h.http.post("/v1/jobs/nope/cancel")).status_code == 404
        task = await h.submit("demo-chat-api", "hello")
        done = await h.wait_task(task["id"])
        assert done["state"] == "success"
        response = await h.http.post(f"/v1/tasks/{task['id']}/retry")
        assert response.status_code == 409
        assert "only failed" in response.json()["error"]["message"]
        response = await h.http.post(f"/v1/tasks/{task['id']}/cancel")
        assert response.status_code == 409


async def test_token_and_port_files(tmp_path: Path) -> None:
    state = tmp_path / "state"
    async with running_service(tmp_path, state_dir=state) as h:
        token_file = state / "token"
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        first = token_file.read_text().strip()
        assert first == h.service.credentials.token
        assert int((state / "port").read_text()) == h.service.http.port  # type: ignore[union-attr]
        assert 49152 <= h.service.http.port <= 65535  # type: ignore[union-attr]
        assert (await h.http.get("/openapi.json")).json()["openapi"].startswith("3.")
        assert (await h.http.get("/healthz")).json()["ok"] is True
    async with running_service(tmp_path, state_dir=state):
        assert (state / "token").read_text().strip() != first


async def test_second_service_on_same_state_dir_is_refused(tmp_path: Path) -> None:
    state = tmp_path / "state"
    async with running_service(tmp_path, state_dir=state) as h:
        second = Service(
            Settings(
                state_dir=state,
                profiles_dir=profiles_dir(tmp_path, ["demo-chat-api"]),
                demo=True,
                time_scale=0.02,
            ),
            demo=Demo(),
        )
        with pytest.raises(LockHeld, match=f"answers on 127.0.0.1:{h.service.http.port}"):  # type: ignore[union-attr]
            await second.start()
        assert (await h.http.get("/healthz")).status_code == 200


@pytest.mark.parametrize("quota", [0, 6])
async def test_provider_quota_outside_1_to_5_is_refused_at_start(
    tmp_path: Path, quota: int
) -> None:
    settings = Settings(
        state_dir=tmp_path / "state",
        profiles_dir=profiles_dir(tmp_path, ["demo-chat-api"]),
        demo=True,
        concurrency={"demo": quota},
    )
    with pytest.raises(ConfigError, match=f"'demo' is {quota}"):
        await Service(settings, demo=Demo()).start()
