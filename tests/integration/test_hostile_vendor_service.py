"""A hostile vendor against the whole service: what is stored, what is sent, how often.

The API runner's own tests (tests/integration/apirunner/test_api_hostile_vendor.py)
cover every shape; these run a few through the real scheduler and store
(SQLite, and PostgreSQL where the shape is about what can be stored), where
a crash would turn into a retry and a secret into a stored row.
"""

from __future__ import annotations

import asyncio
import io
import logging
import sqlite3
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from demo.api_media import png_bytes
from demo.bootstrap import Demo
from demo.hostile import start_hostile
from dispatcher.logs import JsonFormatter, RedactingFilter
from dispatcher.service.core import Service
from dispatcher.service.serving import RunningServer
from dispatcher.settings import Settings
from tests.support.pgdb import migrated_database

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
body = {{ prompt = "{{prompt}}", image = "{{reference_image:upload}}" }}
id = "id"

[api.upload]
path = "/{shape}/uploads"
field = "file"
id = "id"

[api.status]
path = "/{shape}/jobs/{{id}}/status"
state = "status"
error = "error"

[api.result]
path = "/{shape}/jobs/{{id}}/content"
"""

SHAPES = (
    "plain",
    "key_echo",
    "nested_submit",
    "nested",
    "longname",
    "nul422",
    "nulfail",
    "recorded",
    "nested_upload",
    "bigid_upload",
)


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
def dialect() -> str:
    """The store the service runs on; tests about storing parametrise it."""
    return "sqlite"


@pytest.fixture
def database_url(dialect: str, tmp_path: Path) -> Iterator[str | None]:
    if dialect == "sqlite":
        yield None  # the state dir's own SQLite file
    else:
        with migrated_database() as url:
            yield url


@pytest.fixture
async def service(
    tmp_path: Path, vendor: RunningServer, database_url: str | None
) -> AsyncIterator[httpx.AsyncClient]:
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    for shape in SHAPES:
        (profiles / f"hostile-{shape}.toml").write_text(_PROFILE.format(shape=shape))
    settings = Settings(
        state_dir=tmp_path / "state",
        profiles_dir=profiles,
        time_scale=SCALE,
        retry_delay_s=0.0,
        database_url=database_url,
        host_id="hostile-host",
    )
    service = Service(settings, demo=Demo())
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


async def _run(http: httpx.AsyncClient, model: str, **params: Any) -> dict[str, Any]:
    answer = await http.post(
        "/v1/tasks", json={"model": model, "params": {"prompt": "hi", **params}}
    )
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


BOTH = pytest.mark.parametrize("dialect", ["sqlite", "postgresql"])


@BOTH
@pytest.mark.parametrize("shape", ["nul422", "nulfail"])
async def test_a_vendor_error_holding_a_nul_is_stored_and_costs_one_submit(
    service: httpx.AsyncClient, vendor: RunningServer, shape: str
) -> None:
    # PostgreSQL refuses a NUL in text: the failure's write used to raise,
    # leaving the task running until it went stale and was submitted again.
    task = await _run(service, f"hostile-{shape}")
    assert (task["state"], task["attempt"]) == ("failed", 1), task
    message = task["error"]["message"]
    assert "\x00" not in message
    assert "invalid prompt" in message and "rejected" in message
    assert (await _stats(vendor))["submits"] == {shape: 1}
    # The stored row reads back in a listing, with what the vendor said.
    listed = (await service.get("/v1/tasks", params={"state": "failed"})).json()
    assert [t["error"]["message"] for t in listed["items"]] == [message]


_REFUSE_SUCCESS = {
    "sqlite": [
        "CREATE TRIGGER refuse_success BEFORE UPDATE OF state ON tasks "
        "WHEN NEW.state = 'success' BEGIN SELECT RAISE(ABORT, 'the store said no'); END"
    ],
    "postgresql": [
        "CREATE FUNCTION refuse_success() RETURNS trigger AS $$ BEGIN "
        "RAISE EXCEPTION 'the store said no'; END $$ LANGUAGE plpgsql",
        "CREATE TRIGGER refuse_success BEFORE UPDATE ON tasks FOR EACH ROW "
        "WHEN (NEW.state = 'success') EXECUTE FUNCTION refuse_success()",
    ],
}


def _refuse_success_writes(dialect: str, database_url: str | None, state_dir: Path) -> None:
    """The store refuses every write that would record a task's success."""
    if database_url is None:
        with sqlite3.connect(state_dir / "dispatcher.db") as conn:
            for statement in _REFUSE_SUCCESS[dialect]:
                conn.execute(statement)
        return
    with psycopg.connect(database_url, autocommit=True) as pg:
        for statement in _REFUSE_SUCCESS[dialect]:
            pg.execute(statement)


@BOTH
async def test_a_result_the_store_refuses_ends_the_task_without_another_submit(
    service: httpx.AsyncClient,
    vendor: RunningServer,
    dialect: str,
    database_url: str | None,
    tmp_path: Path,
) -> None:
    _refuse_success_writes(dialect, database_url, tmp_path / "state")
    started = time.monotonic()
    task = await _run(service, "hostile-recorded")
    took_s = time.monotonic() - started
    # Every attempt resumed the one remote job (polled, fetched again) and
    # could not record it; none went stale, none submitted again.
    assert (task["state"], task["attempt"]) == ("failed", 3), task
    assert task["error"]["kind"] == "record_failed", task["error"]
    assert "could not be recorded" in task["error"]["message"]
    stats = await _stats(vendor)
    assert stats["submits"] == {"recorded": 1}
    fetched = [r for r in stats["requests"] if r["path"].endswith("/content")]
    assert len(fetched) == 3
    print(f"{dialect}: refused result ended the task in {took_s:.2f} s, 1 submit")


async def test_an_unreadable_upload_answer_is_not_uploaded_again(
    service: httpx.AsyncClient, vendor: RunningServer, tmp_path: Path
) -> None:
    inputs = tmp_path / "state" / "inputs"
    inputs.mkdir(parents=True, exist_ok=True)
    (inputs / "ref.png").write_bytes(png_bytes("ref"))
    task = await _run(service, "hostile-nested_upload", reference_image="ref.png")
    assert (task["state"], task["attempt"], task["error"]["kind"]) == ("failed", 1, "bad_answer")
    stats = await _stats(vendor)
    assert stats["uploads"] == {"nested_upload": 1}
    assert stats["submits"] == {}


async def test_a_10_mb_upload_id_is_not_written_whole_into_the_log(
    service: httpx.AsyncClient, vendor: RunningServer, tmp_path: Path
) -> None:
    inputs = tmp_path / "state" / "inputs"
    inputs.mkdir(parents=True, exist_ok=True)
    (inputs / "ref.png").write_bytes(png_bytes("ref"))
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.addFilter(RedactingFilter())
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        task = await _run(service, "hostile-bigid_upload", reference_image="ref.png")
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    assert task["state"] == "success", task
    lines = [line for line in out.getvalue().splitlines() if "uploaded reference image" in line]
    size = len(out.getvalue())
    print(f"log of a task with a 10 MB upload id: {size} chars")
    assert len(lines) == 1  # the line is there, its id cut
    assert size < 200_000
