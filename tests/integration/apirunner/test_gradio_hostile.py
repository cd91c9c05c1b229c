"""`style = "gradio"` against an app that sends what a real one would not:
an endless event-stream line, a file URL on another host, other events'
messages. Everything it sends is bounded or ignored, never followed off the
profile's host."""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from apirunner.runner import ApiRunner
from dispatcher.clock import SystemClock
from dispatcher.errors import PermanentError
from dispatcher.models import Kind, Stage, Task, new_id
from dispatcher.profiles import Profile, load_profiles
from dispatcher.scheduling.protocol import RunContext, RunResult
from dispatcher.service.serving import RunningServer, start_server
from dispatcher.settings import Settings

SCALE = 0.02
FILE = b"\x89PNG-not-really-but-exact-bytes"
SHAPES = ("endless", "offhost", "crowded")


def _app(seen: Counter[str]) -> Starlette:
    async def info(request: Request) -> Response:
        params = [{"parameter_name": "prompt", "parameter_has_default": False}]
        return JSONResponse({"named_endpoints": {f"/{s}": {"parameters": params} for s in SHAPES}})

    async def call(request: Request) -> Response:
        seen[f"call {request.path_params['name']}"] += 1
        return JSONResponse({"event_id": request.path_params["name"]})

    async def data(request: Request) -> Response:
        shape = request.query_params["session_hash"]

        async def events() -> AsyncIterator[bytes]:
            def say(**msg: Any) -> bytes:
                return f"data: {json.dumps(msg)}\n\n".encode()

            yield say(msg="estimation", event_id=shape, rank=0, rank_eta=1.0)
            if shape == "endless":
                yield b"data: "
                for _ in range(6 * 1024):  # 6 MiB without a line end
                    yield b"x" * 1024
                return
            if shape == "crowded":  # another event's messages on our stream
                yield say(msg="process_completed", event_id="someone-else", success=False)
                output: dict[str, Any] = {"data": ["ours"]}
            else:
                off = "http://files.elsewhere.example/gradio_api/file=/tmp/g/a.png"
                item = {"path": "/tmp/g/a.png", "url": off, "orig_name": "a.png",
                        "meta": {"_type": "gradio.FileData"}}  # fmt: skip
                output = {"data": [item]}
            yield say(msg="process_completed", event_id=shape, success=True, output=output)

        return StreamingResponse(events(), media_type="text/event-stream")

    async def file(request: Request) -> Response:
        seen[f"file {request.path_params['path']}"] += 1
        return Response(FILE, media_type="image/png")

    async def config(request: Request) -> Response:
        return JSONResponse({"dependencies": [{"id": 7, "api_name": "endless"}]})

    async def cancel(request: Request) -> Response:
        body = await request.json()
        seen[f"cancel {body['event_id']} {body['fn_index']}"] += 1
        return JSONResponse({"success": True})

    return Starlette(
        routes=[
            Route("/gradio_api/info", info),
            Route("/gradio_api/call/{name}", call, methods=["POST"]),
            Route("/gradio_api/queue/data", data),
            Route("/gradio_api/file={path:path}", file),
            Route("/config", config),
            Route("/gradio_api/cancel", cancel, methods=["POST"]),
        ]
    )


@pytest.fixture
async def app() -> AsyncIterator[tuple[RunningServer, Counter[str]]]:
    seen: Counter[str] = Counter()
    server = await start_server(_app(seen))
    try:
        yield server, seen
    finally:
        await server.stop()


async def _run(tmp_path: Path, url: str, shape: str) -> RunResult:
    folder = tmp_path / "profiles"
    folder.mkdir(exist_ok=True)
    (folder / f"{shape}.toml").write_text(
        f'name = "{shape}"\nkind = "api"\nprovider = "hostile-gradio"\nmax_attempts = 1\n'
        f'[api]\nstyle = "gradio"\nbase_url = "{url}"\napi_name = "/{shape}"\n'
        'inputs = { prompt = "prompt" }\n'
    )
    profiles: dict[str, Profile] = load_profiles(folder)
    settings = Settings(state_dir=tmp_path / "state", profiles_dir=folder, time_scale=SCALE)
    clock = SystemClock(SCALE)
    runner = ApiRunner(settings, profiles, clock, {})
    await runner.start()
    profile = profiles[shape]
    task = Task(
        id=new_id(),
        model=shape,
        kind=Kind.API,
        queue=profile.queue,
        params={"prompt": "x"},
        fingerprint=new_id(),
        created_at=0.0,
        owner="hostile-gradio",
    )

    async def report(stage: Stage, progress: float | None, queue: int | None) -> None:
        pass

    async def record(remote_id: str) -> None:
        pass

    ctx = RunContext(
        task=task,
        profile=profile,
        lane="api:hostile-gradio",
        owner="hostile-gradio",
        clock=clock,
        result_dir=tmp_path / "results",
        log=logging.LoggerAdapter(logging.getLogger("test.gradio"), {}),
        report_stage=report,
        record_remote_id=record,
    )
    try:
        return await runner.run(task, ctx)
    finally:
        await runner.aclose()


async def test_an_endless_stream_line_fails_the_task_and_cancels_the_event(
    tmp_path: Path, app: tuple[RunningServer, Counter[str]]
) -> None:
    server, seen = app
    with pytest.raises(PermanentError, match="event-stream line over") as caught:
        await _run(tmp_path, server.url, "endless")
    assert caught.value.kind == "bad_answer"
    assert seen["call endless"] == 1 and seen["cancel endless 7"] == 1


async def test_a_file_url_on_another_host_is_fetched_from_the_apps_own(
    tmp_path: Path, app: tuple[RunningServer, Counter[str]]
) -> None:
    server, seen = app
    result = await _run(tmp_path, server.url, "offhost")
    (file,) = result.files
    assert Path(file.path).read_bytes() == FILE
    assert seen["file /tmp/g/a.png"] == 1


async def test_other_events_messages_on_the_stream_are_ignored(
    tmp_path: Path, app: tuple[RunningServer, Counter[str]]
) -> None:
    server, _ = app
    result = await _run(tmp_path, server.url, "crowded")
    assert result.text == "ours"
