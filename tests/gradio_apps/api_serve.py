"""Serve the `api_*` gradio apps on loopback, one process, one port each.

``python -m tests.gradio_apps.api_serve [--token T]`` prints one JSON line,
``{"text": port, "image": port, "queue": port}``, once all three serve. With
``--token``, the image app is private: every request needs
``Authorization: Bearer T`` (as a private hosted app does), else 401.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
from collections import Counter

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import gradio as gr
import uvicorn
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint

from tests.gradio_apps import api_image, api_queue, api_text


def _bound() -> socket.socket:
    # Bound here and served as it is: a port picked, closed and bound again
    # by number could be taken by another process in between.
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    return sock


def _app(demo: gr.Blocks, token: str | None, runs: Counter[str]) -> FastAPI:
    app = FastAPI()
    requests: Counter[str] = Counter()

    async def check(request: Request, call_next: RequestResponseEndpoint) -> Response:
        if request.url.path == "/__stats":  # the tests' view of what the app was asked
            return JSONResponse({"requests": requests, "runs": runs})
        if token and request.headers.get("authorization") != f"Bearer {token}":
            return Response('{"detail": "token needed"}', status_code=401)
        requests[f"{request.method} {request.url.path}"] += 1
        return await call_next(request)

    app.add_middleware(BaseHTTPMiddleware, dispatch=check)
    demo.queue(default_concurrency_limit=4)
    return gr.mount_gradio_app(app, demo, path="")


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--token")
    args = parser.parse_args()
    apps = {
        "text": _app(api_text.build(), None, Counter()),
        "image": _app(api_image.build(), args.token, Counter()),
        "queue": _app(api_queue.build(), None, api_queue.RUNS),
    }
    socks = {name: _bound() for name in apps}
    ports = {name: int(sock.getsockname()[1]) for name, sock in socks.items()}
    servers = {
        name: uvicorn.Server(uvicorn.Config(app, log_level="warning")) for name, app in apps.items()
    }
    serving = [
        asyncio.create_task(server.serve(sockets=[socks[name]])) for name, server in servers.items()
    ]
    while not all(server.started for server in servers.values()):
        if any(task.done() for task in serving):
            raise SystemExit("a gradio app did not start")
        await asyncio.sleep(0.05)
    print(json.dumps(ports), flush=True)
    await asyncio.gather(*serving)


if __name__ == "__main__":
    asyncio.run(main())
    sys.exit(0)
