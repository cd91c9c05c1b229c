"""A local demo ComfyUI server: the same endpoints and message shapes.

``POST /prompt`` validates the graph (ComfyUI's ``node_errors`` shapes) and
queues it; one prompt executes at a time; ``/ws?clientId=`` carries
``status``, ``execution_start``, ``execution_cached``, ``executing``,
``progress``, ``executed``, ``execution_success``, ``execution_error`` and
``execution_interrupted``, only to the socket whose clientId the prompt was
posted with (dropped when it is not connected, as ComfyUI does). The
history entry is written after ``execution_success`` and before the final
``executing`` with ``node: null``. ``GET``/``POST /queue``,
``/history/{id}``, ``/view``, ``/upload/image``, ``/interrupt`` (only the
named prompt, when it is the one running) and ``/object_info`` behave like
the real ones; files are real PNGs (see `demo.comfy_nodes`).

Test hooks: ``GET /__stats`` ({"prompts": [graphs received], "interrupts",
"deleted", "max_running", "flooded"}), ``POST /__drop_sockets`` (close every
websocket, as a proxy restart would) and ``POST /__flood`` ({"binary": n,
"text": n, "size": bytes}: after each prompt's end signal, that many frames
of that size go to its socket, and ``/view`` answers only once they are
sent, so a client that queues what it receives holds them all). Step times
are nominal seconds times `time_scale`.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.parser
import email.policy
import re
import shutil
import socket
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from demo.comfy_nodes import (
    NODES,
    Interrupted,
    NodeFailed,
    Outputs,
    execute,
    node_info,
    object_info,
    validate,
)
from dispatcher.service.serving import RunningServer, bind_loopback, start_server

MAX_BODY_BYTES = 20 * 1024 * 1024
_SAFE_NAME = re.compile(r"^[A-Za-z0-9._ -]+$")


@dataclass
class Item:
    number: int
    prompt_id: str
    graph: dict[str, Any]
    extra_data: dict[str, Any]
    outputs: list[str]

    def as_list(self) -> list[Any]:
        return [self.number, self.prompt_id, self.graph, self.extra_data, self.outputs]


@dataclass
class Stats:
    prompts: list[Any] = field(default_factory=list)
    interrupts: int = 0
    deleted: int = 0
    max_running: int = 0
    flooded: int = 0  # bytes sent by /__flood


class DemoComfy:
    def __init__(self, root: Path, time_scale: float = 1.0) -> None:
        self.time_scale = time_scale
        self.root = root
        self.store = Outputs(root)
        self.number = 0
        self.pending: list[Item] = []
        self.running: Item | None = None
        self.last_node: str | None = None
        self.interrupt_asked = False
        self.history: dict[str, Any] = {}
        self.sockets: dict[str, WebSocket] = {}
        self.stats = Stats()
        self.wake = asyncio.Event()
        self.worker: asyncio.Task[None] | None = None
        self.flood: dict[str, int] = {}
        self.flood_sent = asyncio.Event()
        self.flood_sent.set()

    def input_files(self) -> list[str]:
        """What LoadImage may name: files under input/, as "sub/name"."""
        base = self.root / "input"
        if not base.is_dir():
            return []
        return sorted(p.relative_to(base).as_posix() for p in base.rglob("*") if p.is_file())

    # -- messages ------------------------------------------------------------
    async def send(self, client_id: str | None, kind: str, data: dict[str, Any]) -> None:
        ws = self.sockets.get(client_id) if client_id else None
        if ws is None:
            return  # nobody listening under that id: the message is lost
        with contextlib.suppress(Exception):
            await ws.send_json({"type": kind, "data": data})

    async def broadcast_status(self) -> None:
        remaining = len(self.pending) + (1 if self.running else 0)
        for sid in list(self.sockets):
            await self.send(
                sid, "status", {"status": {"exec_info": {"queue_remaining": remaining}}}
            )

    # -- the one worker ------------------------------------------------------
    def start(self) -> None:
        if self.worker is None:
            self.worker = asyncio.create_task(self._work())

    async def _work(self) -> None:
        while True:
            while not self.pending:
                self.wake.clear()
                await self.wake.wait()
            item = min(self.pending, key=lambda i: i.number)
            self.pending.remove(item)
            self.running = item
            self.stats.max_running = max(self.stats.max_running, 1)
            try:
                await self._run(item)
            finally:
                self.running = None
                self.last_node = None
            await self.broadcast_status()

    async def _run(self, item: Item) -> None:
        # An interrupt that arrived while idle is discarded when a prompt starts.
        self.interrupt_asked = False
        client_id = item.extra_data.get("client_id")
        messages: list[list[Any]] = []
        pid = item.prompt_id

        async def note(kind: str, data: dict[str, Any]) -> None:
            data = {**data, "prompt_id": pid, "timestamp": int(time.time() * 1000)}
            messages.append([kind, data])
            await self.send(client_id, kind, data)

        async def send(kind: str, data: dict[str, Any]) -> None:
            if kind == "execution_cached":
                await note(kind, data)
                return
            if kind == "executing":
                self.last_node = data["node"]
            await self.send(client_id, kind, {**data, "prompt_id": pid})

        async def tick(nominal_s: float, node_id: str, node_type: str) -> None:
            if self.interrupt_asked:
                raise Interrupted(node_id, node_type)
            await asyncio.sleep(nominal_s * self.time_scale)
            if self.interrupt_asked:
                raise Interrupted(node_id, node_type)

        await note("execution_start", {})
        status = "success"
        ui: dict[str, Any] = {}
        try:
            ui, _ran = await execute(item.graph, item.outputs, self.store, send, tick)
            await note("execution_success", {})
        except Interrupted as exc:
            status = "error"
            self.stats.interrupts += 1
            await note(
                "execution_interrupted",
                {"node_id": exc.node_id, "node_type": exc.node_type, "executed": []},
            )
        except Exception as exc:  # a node's failure, as ComfyUI reports any exception
            status = "error"
            if not isinstance(exc, NodeFailed):
                exc = NodeFailed(self.last_node or "", "", type(exc).__name__, str(exc))
            await note(
                "execution_error",
                {
                    "node_id": exc.node_id,
                    "node_type": exc.node_type,
                    "executed": [],
                    "exception_message": exc.message,
                    "exception_type": exc.exc_type,
                    "traceback": [],
                    "current_inputs": {},
                    "current_outputs": {},
                },
            )
        self.history[pid] = {
            "prompt": item.as_list(),
            "outputs": ui,
            "status": {
                "status_str": status,
                "completed": status == "success",
                "messages": messages,
            },
            "meta": {nid: {"node_id": nid, "display_node": nid} for nid in ui},
        }
        await self.send(client_id, "executing", {"node": None, "prompt_id": pid})
        if self.flood:
            await self._flood(client_id)

    async def _flood(self, client_id: str | None) -> None:
        ws = self.sockets.get(client_id) if client_id else None
        self.flood_sent.clear()
        try:
            size = self.flood.get("size", 0)
            # Zeros: to a client that negotiates permessage-deflate, a few KB
            # on the wire, each inflated to `size` on arrival.
            blob = bytes(size)
            text = '{"type": "progress_state", "data": {"pad": "' + "0" * size + '"}}'
            for _ in range(self.flood.get("binary", 0)):
                if ws is not None:
                    await ws.send_bytes(blob)
                    self.stats.flooded += size
            for _ in range(self.flood.get("text", 0)):
                if ws is not None:
                    await ws.send_text(text)
                    self.stats.flooded += len(text)
        except Exception:  # the client closed the socket (a frame too big for it)
            pass
        finally:
            self.flood_sent.set()

    # -- HTTP ----------------------------------------------------------------
    async def post_prompt(self, request: Request) -> Response:
        try:
            body = await request.json()
        except ValueError:
            return JSONResponse({"error": "invalid json", "node_errors": {}}, 400)
        if not isinstance(body, dict) or "prompt" not in body:
            return JSONResponse(
                {
                    "error": {"type": "no_prompt", "message": "No prompt provided", "details": ""},
                    "node_errors": {},
                },
                400,
            )
        graph = body["prompt"]
        self.stats.prompts.append(graph)
        self.number += 1  # every POST takes a number, rejected ones too
        number = self.number
        error, node_errors, outputs = validate(graph, self.input_files())
        if error is not None:
            return JSONResponse({"error": error, "node_errors": node_errors}, 400)
        prompt_id = str(uuid.uuid4())
        extra = dict(body.get("extra_data") or {})
        if isinstance(body.get("client_id"), str):
            extra["client_id"] = body["client_id"]
        self.pending.append(Item(number, prompt_id, graph, extra, outputs))
        self.wake.set()
        await self.broadcast_status()
        return JSONResponse({"prompt_id": prompt_id, "number": number, "node_errors": node_errors})

    async def get_queue(self, request: Request) -> Response:
        # Heap order, not sorted: clients must sort by number themselves.
        pending = sorted(self.pending, key=lambda i: (i.number % 3, i.number))
        running = [self.running.as_list()] if self.running else []
        return JSONResponse(
            {"queue_running": running, "queue_pending": [i.as_list() for i in pending]}
        )

    async def post_queue(self, request: Request) -> Response:
        body = await _json(request)
        if body.get("clear"):
            self.stats.deleted += len(self.pending)
            self.pending.clear()
        for pid in body.get("delete") or []:
            before = len(self.pending)
            self.pending = [i for i in self.pending if i.prompt_id != pid]
            self.stats.deleted += before - len(self.pending)
        return Response(status_code=200)

    async def post_interrupt(self, request: Request) -> Response:
        body = await _json(request)
        wanted = body.get("prompt_id")
        if wanted is None or (self.running is not None and self.running.prompt_id == wanted):
            self.interrupt_asked = True
        return Response(status_code=200)

    async def get_history(self, request: Request) -> Response:
        pid = request.path_params.get("prompt_id")
        if pid is None:
            return JSONResponse(self.history)
        entry = self.history.get(pid)
        return JSONResponse({pid: entry} if entry is not None else {})

    async def get_view(self, request: Request) -> Response:
        await self.flood_sent.wait()
        name = request.query_params.get("filename", "")
        subfolder = request.query_params.get("subfolder", "")
        kind = request.query_params.get("type", "output")
        if kind not in ("output", "input", "temp") or not _SAFE_NAME.match(name):
            return Response(status_code=400)
        base = (self.root / kind).resolve()
        path = (base / subfolder / name).resolve()
        if not path.is_relative_to(base) or not path.is_file():
            return Response(status_code=404)
        return FileResponse(path, media_type="image/png", filename=name)

    async def post_upload(self, request: Request) -> Response:
        raw = await request.body()
        if len(raw) > MAX_BODY_BYTES:
            return Response("too large", status_code=413)
        head = f"Content-Type: {request.headers.get('content-type', '')}\r\n\r\n".encode()
        message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + raw)
        fields: dict[str, Any] = {}
        for part in message.iter_parts():
            fields[str(part.get_param("name", header="content-disposition"))] = part
        image = fields.get("image")
        if image is None or not _SAFE_NAME.match(image.get_filename() or ""):
            return Response(status_code=400)
        subfolder = ""
        if "subfolder" in fields:
            subfolder = str(fields["subfolder"].get_content()).strip()
        if subfolder and not _SAFE_NAME.match(subfolder):
            return Response(status_code=400)
        folder = self.root / "input" / subfolder
        folder.mkdir(parents=True, exist_ok=True)
        name = str(image.get_filename())
        (folder / name).write_bytes(image.get_payload(decode=True))
        return JSONResponse({"name": name, "subfolder": subfolder, "type": "input"})

    async def get_object_info(self, request: Request) -> Response:
        name = request.path_params.get("node_class")
        if name is None:
            return JSONResponse(object_info(self.input_files()))
        # ComfyUI answers {} for a class it does not know.
        if name not in NODES:
            return JSONResponse({})
        return JSONResponse({name: node_info(name, self.input_files())})

    async def websocket(self, ws: WebSocket) -> None:
        await ws.accept()
        sid = ws.query_params.get("clientId") or uuid.uuid4().hex
        self.sockets[sid] = ws
        try:
            remaining = len(self.pending) + (1 if self.running else 0)
            await ws.send_json(
                {
                    "type": "status",
                    "data": {"status": {"exec_info": {"queue_remaining": remaining}}, "sid": sid},
                }
            )
            running = self.running
            if running is not None and running.extra_data.get("client_id") == sid:
                # What a reconnect gets: the node, without a prompt_id.
                await ws.send_json({"type": "executing", "data": {"node": self.last_node}})
            while True:
                await ws.receive_text()
        except WebSocketDisconnect:
            pass
        finally:
            # ComfyUI removes the entry for this id even when a newer socket
            # holds it now; clients use a fresh id per connection.
            self.sockets.pop(sid, None)

    async def get_stats(self, request: Request) -> Response:
        return JSONResponse(
            {
                "prompts": self.stats.prompts,
                "interrupts": self.stats.interrupts,
                "deleted": self.stats.deleted,
                "max_running": self.stats.max_running,
                "flooded": self.stats.flooded,
            }
        )

    async def set_flood(self, request: Request) -> Response:
        body = await _json(request)
        self.flood = {k: int(body.get(k, 0)) for k in ("binary", "text", "size")}
        return JSONResponse(self.flood)

    async def drop_sockets(self, request: Request) -> Response:
        sockets, self.sockets = list(self.sockets.values()), {}
        for ws in sockets:
            with contextlib.suppress(Exception):
                await ws.close(code=1012)
        return JSONResponse({"dropped": len(sockets)})

    def routes(self) -> list[Route | WebSocketRoute]:
        return [
            Route("/prompt", self.post_prompt, methods=["POST"]),
            Route("/queue", self.get_queue, methods=["GET"]),
            Route("/queue", self.post_queue, methods=["POST"]),
            Route("/interrupt", self.post_interrupt, methods=["POST"]),
            Route("/history", self.get_history, methods=["GET"]),
            Route("/history/{prompt_id}", self.get_history, methods=["GET"]),
            Route("/view", self.get_view, methods=["GET"]),
            Route("/upload/image", self.post_upload, methods=["POST"]),
            Route("/object_info", self.get_object_info, methods=["GET"]),
            Route("/object_info/{node_class}", self.get_object_info, methods=["GET"]),
            Route("/__stats", self.get_stats, methods=["GET"]),
            Route("/__drop_sockets", self.drop_sockets, methods=["POST"]),
            Route("/__flood", self.set_flood, methods=["POST"]),
            WebSocketRoute("/ws", self.websocket),
        ]


async def _json(request: Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


@dataclass
class ComfyServer(RunningServer):
    """The running server; stopping it also stops the worker and removes its files.

    `go_down` makes it refuse connections while its queue, the running
    prompt and its history live on (a network outage, a proxy restarting);
    `come_back` serves again on the same port.
    """

    comfy: DemoComfy | None = None
    app: Starlette | None = None
    # While down: the port, bound but not listening (connections are
    # refused, and no other socket can take the port meanwhile).
    holder: socket.socket | None = None

    async def go_down(self) -> None:
        assert self.comfy is not None and self.holder is None
        sockets, self.comfy.sockets = list(self.comfy.sockets.values()), {}
        for ws in sockets:
            with contextlib.suppress(Exception):
                await ws.close(code=1001)
        await RunningServer.stop(self)
        self.holder = bind_loopback(self.port)

    async def come_back(self) -> None:
        assert self.app is not None and self.holder is not None
        holder, self.holder = self.holder, None
        holder.close()
        running = await start_server(self.app, self.port)
        self.server, self.task, self.sock = running.server, running.task, running.sock

    async def stop(self) -> None:
        if self.holder is not None:
            self.holder.close()
            self.holder = None
        else:
            await super().stop()
        if self.comfy is not None:
            worker = self.comfy.worker
            if worker is not None:
                worker.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await worker
            shutil.rmtree(self.comfy.root, ignore_errors=True)


async def start_demo_comfy(port: int | None = None, time_scale: float = 1.0) -> ComfyServer:
    """Serve the demo ComfyUI on 127.0.0.1 (a random free port by default)."""
    comfy = DemoComfy(Path(tempfile.mkdtemp(prefix="demo-comfy-")), time_scale=time_scale)
    app = Starlette(routes=comfy.routes())
    comfy.start()
    running = await start_server(app, port)
    return ComfyServer(
        running.server,
        running.task,
        running.port,
        running.http_parser,
        running.sock,
        comfy=comfy,
        app=app,
    )
