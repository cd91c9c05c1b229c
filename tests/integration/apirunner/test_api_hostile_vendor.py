"""The API runner against a hostile vendor (`demo.hostile`).

Each shape runs the way the scheduler runs a task: attempt after attempt
while the error is retryable (a crash counts as retryable, as the scheduler
takes it), at most `max_attempts`. What the vendor saw is then counted: one
submit whatever it answered, nothing sent to a host no profile names, no API
key on a host other than the profile's own.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from apirunner.runner import ApiRunner
from demo.hostile import start_hostile
from dispatcher.clock import SystemClock
from dispatcher.errors import RunError
from dispatcher.models import Kind, Task, new_id
from dispatcher.profiles import Profile, load_profiles
from dispatcher.scheduling.protocol import RunContext, RunResult
from dispatcher.service.serving import RunningServer
from dispatcher.settings import Settings
from dispatcher.testing import run_context
from tests.support.helpers import result_files

SCALE = 0.02
KEY = "hk-" + "k" * 40
MAX_DOWNLOAD_BYTES = 1024 * 1024
MAX_JSON_BYTES = 256 * 1024

_PROFILE = """
name = "hostile-{shape}"
kind = "api"
provider = "hostile"
max_attempts = 3

[api]
base_url = "${{HOSTILE_URL}}"
auth_header = "X-Api-Key"
auth_env = "HOSTILE_API_KEY"
auth_prefix = ""
style = "async-job"
timeout_s = {timeout_s}
max_download_bytes = {max_download_bytes}

[api.submit]
method = "POST"
path = "/{shape}/jobs"
body = {{ prompt = "{{prompt}}" }}
id = "id"

[api.status]
path = "/{shape}/jobs/{{id}}/status"
state = "status"
progress = "progress"

[api.result]
path = "/{shape}/jobs/{{id}}/content"
"""

# A second vendor: its host is allowlisted, but the first vendor's key is not its to see.
_OTHER = """
name = "other-chat"
kind = "api"
provider = "other"

[api]
base_url = "${OTHER_URL}"
style = "chat"

[api.submit]
method = "POST"
path = "/chat"

[api.result]
text = "text"
"""

SHAPES = (
    "plain",
    "key_echo",
    "nested_submit",
    "dotdot",
    "slash",
    "nested",
    "huge",
    "nan",
    "endless",
    "drip",
    "longname",
    "dotname",
    "nulname",
    "offsite",
    "crossorigin",
    "loop",
)


@dataclass
class Vendor:
    server: RunningServer

    @property
    def url(self) -> str:
        return self.server.url

    async def stats(self) -> dict[str, Any]:
        async with httpx.AsyncClient() as http:
            answer = await http.get(f"{self.url}/__stats")
        data: dict[str, Any] = answer.json()
        return data

    async def config(self, **body: Any) -> None:
        async with httpx.AsyncClient() as http:
            (await http.post(f"{self.url}/__config", json=body)).raise_for_status()


@dataclass
class Outcome:
    result: RunResult | None
    errors: list[BaseException] = field(default_factory=list)

    @property
    def last(self) -> BaseException:
        return self.errors[-1]


@dataclass
class Hostile:
    vendor: Vendor
    other: Vendor
    foreign: Vendor
    runner: ApiRunner
    profiles: dict[str, Profile]
    clock: SystemClock
    result_dir: Path

    def task(self, model: str) -> Task:
        profile = self.profiles[model]
        return Task(
            id=new_id(),
            model=profile.name,
            kind=Kind.API,
            queue=profile.queue,
            params={"prompt": f"model {model}"},
            fingerprint=new_id(),
            created_at=0.0,
            owner=profile.provider,
            max_attempts=profile.max_attempts,
        )

    def ctx(self, task: Task) -> RunContext:
        profile = self.profiles[task.model]
        return run_context(
            task,
            profile,
            owner=profile.provider or "",
            result_dir=self.result_dir / task.id,
            clock=self.clock,
        )

    async def run_like_the_scheduler(self, shape: str, model: str | None = None) -> Outcome:
        """Attempts while the error is retryable, as `Scheduler` and `states.after_failure` do."""
        task = self.task(model or f"hostile-{shape}")
        outcome = Outcome(None)
        for attempt in range(1, task.max_attempts + 1):
            current = task.replace(attempt=attempt, remote_id=None)
            try:
                outcome.result = await self.runner.run(current, self.ctx(current))
                return outcome
            except RunError as exc:
                outcome.errors.append(exc)
                if not exc.retryable:
                    return outcome
            except Exception as exc:  # the scheduler: "runner crashed", transient
                outcome.errors.append(exc)
        return outcome


def _write_profiles(directory: Path, timeouts: dict[str, float]) -> None:
    directory.mkdir()
    for shape in SHAPES:
        text = _PROFILE.format(
            shape=shape,
            timeout_s=timeouts.get(shape, 600),
            max_download_bytes=MAX_DOWNLOAD_BYTES,
        )
        (directory / f"hostile-{shape}.toml").write_text(text)
    (directory / "other-chat.toml").write_text(_OTHER)


@pytest.fixture
async def hostile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Hostile]:
    monkeypatch.setenv("HOSTILE_API_KEY", KEY)
    servers = [await start_hostile() for _ in range(3)]
    vendor, other, foreign = (Vendor(server) for server in servers)
    clock = SystemClock(time_scale=SCALE)
    # The drip would never end: only the deadline (50 nominal s, 1 real s) stops it.
    _write_profiles(tmp_path / "profiles", {"drip": 50})
    profiles = load_profiles(
        tmp_path / "profiles", {"HOSTILE_URL": vendor.url, "OTHER_URL": other.url}
    )
    await vendor.config(elsewhere=foreign.url, other=other.url, huge_bytes=8 * 1024 * 1024)
    settings = Settings(
        state_dir=tmp_path / "state",
        http_timeout_s=10.0,
        time_scale=SCALE,
        max_json_bytes=MAX_JSON_BYTES,
    )
    runner = ApiRunner(settings, profiles, clock, {"hostile": 2, "other": 1})
    await runner.start()
    try:
        yield Hostile(vendor, other, foreign, runner, profiles, clock, tmp_path / "results")
    finally:
        await runner.aclose()
        for server in servers:
            await server.stop()


async def _submits(vendor: Vendor, shape: str) -> int:
    return int((await vendor.stats())["submits"].get(shape, 0))


async def test_a_well_behaved_job_is_the_control(hostile: Hostile) -> None:
    outcome = await hostile.run_like_the_scheduler("plain")
    assert outcome.result is not None, outcome.errors
    (file,) = outcome.result.files
    assert Path(file.path).read_bytes().startswith(b"\x89PNG")
    stats = await hostile.vendor.stats()
    assert stats["submits"] == {"plain": 1}
    # The key goes to its own vendor (the control for the tests below).
    assert all(r["headers"].get("x-api-key") == KEY for r in stats["requests"])


@pytest.mark.parametrize(
    ("shape", "kind"),
    [
        ("nested_submit", "bad_answer"),
        ("dotdot", "bad_answer"),
        ("slash", "bad_answer"),
        ("nested", "bad_answer"),
        ("nan", "bad_answer"),
        ("huge", "too_large"),
        ("endless", "too_large"),
        ("drip", "timeout"),
        ("loop", "redirects"),
        ("offsite", "allowlist"),
        ("key_echo", "http_401"),
    ],
)
async def test_a_hostile_answer_fails_the_task_once_without_a_second_submit(
    hostile: Hostile, shape: str, kind: str
) -> None:
    outcome = await hostile.run_like_the_scheduler(shape)
    assert outcome.result is None
    assert len(outcome.errors) == 1, [repr(e) for e in outcome.errors]
    error = outcome.last
    assert isinstance(error, RunError) and not error.retryable, repr(error)
    assert error.kind == kind, repr(error)
    assert await _submits(hostile.vendor, shape) == 1
    stats = await hostile.vendor.stats()
    # A job named ".." must not turn /dotdot/jobs/../status into /dotdot/status.
    assert all(r["path"] != f"/{shape}/status" for r in stats["requests"])
    assert (await hostile.foreign.stats())["request_count"] == 0
    # No partial download is left behind.
    assert result_files(hostile.result_dir) == []


async def test_the_endless_download_stops_at_the_cap(hostile: Hostile) -> None:
    await hostile.run_like_the_scheduler("endless")
    served = (await hostile.vendor.stats())["bytes_served"]
    # The cap plus what was in flight on the socket; never the vendor's "forever".
    assert served < MAX_DOWNLOAD_BYTES + 16 * 1024 * 1024


@pytest.mark.parametrize("shape", ["longname", "dotname", "nulname"])
async def test_hostile_file_names_are_made_safe(hostile: Hostile, shape: str) -> None:
    outcome = await hostile.run_like_the_scheduler(shape)
    assert outcome.result is not None, [repr(e) for e in outcome.errors]
    (file,) = outcome.result.files
    path = Path(file.path)
    assert path.parent.parent == hostile.result_dir
    assert path.read_bytes().startswith(b"\x89PNG")
    assert len(file.name.encode()) <= 200
    assert "\x00" not in file.name and "/" not in file.name and not file.name.startswith(".")
    assert await _submits(hostile.vendor, shape) == 1


async def test_a_cross_origin_redirect_does_not_carry_the_api_key(hostile: Hostile) -> None:
    outcome = await hostile.run_like_the_scheduler("crossorigin")
    assert outcome.result is not None, [repr(e) for e in outcome.errors]
    (landed,) = (await hostile.other.stats())["requests"]
    assert landed["path"] == "/collect.png"
    headers = landed["headers"]
    assert "x-api-key" not in headers and "authorization" not in headers
    assert KEY not in repr(headers)
    assert await _submits(hostile.vendor, "crossorigin") == 1
    assert os.environ["HOSTILE_API_KEY"] == KEY


async def test_a_chat_answer_that_is_not_json_is_not_asked_for_again(hostile: Hostile) -> None:
    # The chat answer is the generation: a 2xx we cannot read was still paid for.
    outcome = await hostile.run_like_the_scheduler("chat", model="other-chat")
    assert outcome.result is None
    (error,) = outcome.errors
    assert isinstance(error, RunError) and (error.kind, error.retryable) == ("bad_answer", False)
    assert [r["path"] for r in (await hostile.other.stats())["requests"]] == ["/chat"]
