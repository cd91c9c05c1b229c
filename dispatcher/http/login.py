"""Routes of remote logins, session imports and the live view of a running web task.

The browser side is `webrunner.login`; here the HTTP edge, and what a
login changes in the dispatcher: the account enabled, its tasks that
failed on a logout back in the queue.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from dispatcher import strictjson
from dispatcher.errors import NotFound, StateConflict
from dispatcher.events import TaskChanged
from dispatcher.http import bodies
from dispatcher.models import State
from webrunner.cookies import CookieFileError, parse_session_file, site_cookies, site_host

if TYPE_CHECKING:
    from dispatcher.events import EventBus
    from dispatcher.service.core import Service
    from webrunner.login import Frame, LiveView, LoginDesk
    from webrunner.runner import WebRunner

log = logging.getLogger("dispatcher.http")

FRAME_KEEPALIVE_S = 15.0
STREAM_HEADERS = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
# Failed tasks looked at per model when an account comes back.
REQUEUE_SCAN = 500


def login_path(account: str) -> str:
    """The dashboard page of an account's login (where the one-time link leads)."""
    return f"/#login/{account}"


async def _end_with(bus: EventBus, queue: asyncio.Queue[Frame | None], task_id: str | None) -> None:
    """End a frame stream when the service stops (the bus closes before the server),
    or when the watched task's attempt ends."""
    async with bus.subscribe() as events:
        while (event := await events.get()) is not None:
            match event:
                case TaskChanged(task=task) if (
                    task.id == task_id and task.state is not State.RUNNING
                ):
                    break
    if queue.full():
        queue.get_nowait()
    queue.put_nowait(None)


async def _frames(
    view: LiveView, bus: EventBus, task_id: str | None = None
) -> AsyncIterator[bytes]:
    async with view.watch() as queue:
        closer = asyncio.create_task(_end_with(bus, queue, task_id))
        try:
            async for chunk in _frame_chunks(queue):
                yield chunk
        finally:
            closer.cancel()


async def _frame_chunks(queue: asyncio.Queue[Frame | None]) -> AsyncIterator[bytes]:
    yield b": connected\n\n"
    while True:
        try:
            frame: Frame | None = await asyncio.wait_for(queue.get(), FRAME_KEEPALIVE_S)
        except TimeoutError:
            yield b": keep-alive\n\n"
            continue
        if frame is None:
            yield b"event: end\ndata: {}\n\n"
            return
        data = {"jpeg": frame.jpeg_b64, "width": frame.width_px, "height": frame.height_px}
        yield f"event: frame\ndata: {strictjson.dumps(data)}\n\n".encode()


class LoginRoutes:
    def __init__(self, service: Service) -> None:
        self.service = service

    def _runner(self) -> WebRunner:
        runner = self.service.web
        if runner is None:
            raise NotFound("this service runs no web models, so it has no web accounts")
        return runner

    def _desk(self) -> LoginDesk:
        return self._runner().logins

    def _account(self, request: Request) -> str:
        name = str(request.path_params["name"])
        self._runner().spec_for(name)  # NotFound for an API provider or an unknown name
        return name

    async def requeue_auth_failed(self, account: str) -> list[str]:
        """Retry the failed tasks of the account's models that met a logout."""
        runner = self._runner()
        models = runner.models_of(account)
        ledger = self.service.ledger
        retried = []
        for model in models:
            for task in await ledger.list_tasks(
                states=[State.FAILED], model=model, limit=REQUEUE_SCAN
            ):
                if task.error is not None and task.error.kind == "auth":
                    retried.append((await ledger.retry(task.id)).id)
        if retried:
            log.info(
                "[web:%s] %d task(s) that met a logout back in the queue",
                account,
                len(retried),
                extra={"lane": f"web:{account}"},
            )
        return retried

    async def _comes_back(self, account: str) -> dict[str, object]:
        enabled = await self.service.accounts.enable(account)
        retried = await self.requeue_auth_failed(account)
        return {"logged_in": True, "account": enabled.to_json(), "requeued": retried}

    # -- handlers ---------------------------------------------------------------
    async def open(self, request: Request) -> Response:
        account = self._account(request)
        login = await self._desk().open(account)
        answer = {"account": account, "browser_pid": login.pid, "path": login_path(account)}
        return JSONResponse(answer, status_code=201)

    async def frames(self, request: Request) -> Response:
        login = self._desk().get(self._account(request))
        assert login.view is not None
        return StreamingResponse(
            _frames(login.view, self.service.events),
            media_type="text/event-stream",
            headers=STREAM_HEADERS,
        )

    async def send_input(self, request: Request) -> Response:
        raw = strictjson.loads(await request.body() or b"null")
        bodies.validate(bodies.LoginInputBody, raw, "body")
        account = self._account(request)
        login = self._desk().get(account)
        login.touch()
        assert login.view is not None
        await login.view.send_input(raw)
        return JSONResponse({"ok": True})

    async def done(self, request: Request) -> Response:
        account = self._account(request)
        if not await self._desk().done(account):
            raise StateConflict(
                "the page does not show that it is logged in yet (the login form is still "
                "there); finish the login in the view, then press Done again"
            )
        return JSONResponse(await self._comes_back(account))

    async def cancel(self, request: Request) -> Response:
        account = self._account(request)
        await self._desk().cancel(account)
        return JSONResponse({"account": account, "closed": True})

    async def import_session(self, request: Request) -> Response:
        raw = strictjson.loads(await request.body() or b"null")
        bodies.validate(bodies.ImportBody, raw, "body")
        account = self._account(request)
        url = self._runner().spec_for(account).url
        every = parse_session_file(raw["text"], now=self.service.clock.now())
        cookies, dropped = site_cookies(every, url)
        if not cookies:
            raise CookieFileError(
                f"none of the file's {dropped} cookie(s) is for {site_host(url)}, the site of "
                f"{account}'s model; export the cookies of that site"
            )
        counts = {"cookies": len(cookies), "dropped": dropped}
        if not await self._desk().import_cookies(account, cookies):
            return JSONResponse({"logged_in": False, "account": account, **counts})
        answer = await self._comes_back(account)
        answer.update(counts)
        return JSONResponse(answer)

    async def watch_task(self, request: Request) -> Response:
        """The page of a running web task, read-only: frames only, no input."""
        from webrunner.login import LiveView

        task = await self.service.ledger.get(request.path_params["id"])
        runner = self._runner()
        session = runner.running_browser(task.owner) if task.owner else None
        if task.state is not State.RUNNING or session is None:
            raise StateConflict(f"task {task.id} is not running in a browser now")
        pages = session.context.pages
        if not pages:
            raise StateConflict(f"task {task.id} has no page open")
        view = LiveView(session.context, pages[0])
        await view.start()

        async def stream() -> AsyncIterator[bytes]:
            try:
                async for chunk in _frames(view, self.service.events, task.id):
                    yield chunk
            finally:
                await view.stop()

        return StreamingResponse(stream(), media_type="text/event-stream", headers=STREAM_HEADERS)


def login_routes(service: Service) -> list[Route]:
    api = LoginRoutes(service)
    base = "/v1/accounts/{name}"
    return [
        Route(f"{base}/login", api.open, methods=["POST"]),
        Route(f"{base}/login/frames", api.frames, methods=["GET"]),
        Route(f"{base}/login/input", api.send_input, methods=["POST"]),
        Route(f"{base}/login/done", api.done, methods=["POST"]),
        Route(f"{base}/login/cancel", api.cancel, methods=["POST"]),
        Route(f"{base}/import", api.import_session, methods=["POST"]),
        Route("/v1/tasks/{id}/live", api.watch_task, methods=["GET"]),
    ]
