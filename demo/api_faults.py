"""Misbehaviour on demand for the demo API provider.

``POST /__mode`` asks for storms of 429/5xx, slow answers, dropped or reset
connections, truncated or dripping bodies, failing jobs or foreign result
URLs; a `FaultPlan` keeps what was asked for, and the `FrontDoor` middleware
(which also counts requests and checks API keys) acts it out before any
route runs.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from demo.api_protocol import (
    OPENAI,
    OPERATIONS,
    PERMANENT_REASON,
    TRANSIENT_REASON,
    api_key,
    error_response,
    operation,
)

if TYPE_CHECKING:
    from demo.api_provider import DemoProvider


@dataclass
class Fault:
    mode: str
    remaining: int
    only: str | None = None  # chat|submit|poll|result|content|cancel|upload
    status: int | None = None
    retry_after_s: float = 1.0
    header: str = "seconds"  # seconds|ms|date|both
    when: str = "before"  # before|after|mid|reset (drop)
    delay_s: float = 1.0  # slow and drip (between chunks), nominal
    chunk_bytes: int = 1024  # drip


@dataclass
class FaultPlan:
    """The faults asked for and not yet spent."""

    faults: list[Fault] = field(default_factory=list)
    failing_jobs: list[str] = field(default_factory=list)  # reasons for the next jobs created
    foreign_urls: int = 0
    # Keys the provider refuses with 401 until restored ("*": every key).
    revoked: set[str] = field(default_factory=set)

    def key_revoked(self, key: str) -> bool:
        return key in self.revoked or "*" in self.revoked

    async def switch_keys(self, request: Request) -> Response:
        """``POST /__keys/revoke`` / ``/__keys/restore`` with ``{"key": K}``
        (no body: every key): a revoked key gets 401 until it is restored."""
        switch = request.path_params["switch"]
        if switch not in ("revoke", "restore"):
            return JSONResponse({"error": "use /__keys/revoke or /__keys/restore"}, 404)
        raw = await request.body()
        try:
            key = str(json.loads(raw)["key"]) if raw.strip() else "*"
        except (ValueError, KeyError, TypeError):
            return JSONResponse({"error": 'send JSON {"key": ...} or no body'}, 400)
        if switch == "revoke":
            self.revoked.add(key)
        elif key == "*":
            self.revoked.clear()
        else:
            self.revoked.discard(key)
        return JSONResponse({"revoked": sorted(self.revoked)})

    def take(self, op: str) -> Fault | None:
        """The fault the next request of operation `op` meets, if any; it is spent."""
        for fault in self.faults:
            if fault.remaining > 0 and (fault.only is None or fault.only == op):
                fault.remaining -= 1
                return fault
        return None

    def next_job_failure(self) -> str | None:
        """Why the next job created must fail, if `fail_jobs` asked for it."""
        return self.failing_jobs.pop(0) if self.failing_jobs else None

    def take_foreign_url(self) -> bool:
        """Whether the next fal submit hands back URLs on a host no profile names."""
        if self.foreign_urls > 0:
            self.foreign_urls -= 1
            return True
        return False

    def describe(self) -> dict[str, Any]:
        return {
            "faults": [asdict(f) for f in self.faults if f.remaining],
            "failing_jobs": len(self.failing_jobs),
            "foreign_urls": self.foreign_urls,
        }

    def apply(self, body: Any) -> None:
        """Take one ``POST /__mode`` body into the plan."""
        fault = self.parse_mode(body)
        if fault is not None:
            self.faults.append(fault)

    def parse_mode(self, body: Any) -> Fault | None:
        """One ``POST /__mode`` body. Each fault hits the next `count` requests
        (only those of operation `only` when given: chat, submit, poll, result, upload,
        content, cancel):

        - ``429_storm``: 429 with Retry-After `retry_after_s` (default 1) sent
          as `header`: seconds (default), ms (retry-after-ms), date, both, or
          none (a bare 429).
        - ``5xx``: `status` (default 503); with `retry_after_s`, a Retry-After.
        - ``slow``: the answer starts `delay_s` nominal seconds late.
        - ``drop``: the connection is closed `when`: before the work, after it
          (the job exists, the answer is lost), mid-answer (half a body), or
          reset (half a body, then a TCP RST).
        - ``truncate``: half the body under the full Content-Length, then a
          clean close (FIN).
        - ``drip``: the body in `chunk_bytes` pieces (default 1024), `delay_s`
          nominal seconds apart.
        - ``fail_jobs``: the next `count` jobs fail; `reason` permanent,
          transient (default) or any text.
        - ``foreign_urls``: the next fal submits hand back URLs on "localhost".
        - ``clear``: forget all of the above.
        """
        if not isinstance(body, dict):
            raise TypeError('send a JSON object like {"mode": "429_storm", "count": 3}')
        mode = str(body["mode"])
        count = int(body.get("count", 1))
        only = body.get("only")
        if only is not None and only not in OPERATIONS:
            raise ValueError(f"unknown `only` {only!r}")
        if mode == "clear":
            self.faults.clear()
            self.failing_jobs.clear()
            self.foreign_urls = 0
            return None
        if mode == "fail_jobs":
            reason = str(body.get("reason", "transient"))
            known = {"permanent": PERMANENT_REASON, "transient": TRANSIENT_REASON}
            text = known.get(reason, reason)
            self.failing_jobs.extend([text] * count)
            return None
        if mode == "foreign_urls":
            self.foreign_urls += count
            return None
        header = str(body.get("header", "seconds"))
        if header not in ("seconds", "ms", "date", "both", "none"):
            raise ValueError(f"unknown `header` {header!r}")
        if mode == "429_storm":
            return Fault(mode, count, only, 429, float(body.get("retry_after_s", 1.0)), header)
        if mode == "5xx":
            wait = body.get("retry_after_s")
            return Fault(
                mode,
                count,
                only,
                int(body.get("status", 503)),
                -1.0 if wait is None else float(wait),
                header,
            )
        if mode == "slow":
            return Fault(mode, count, only, delay_s=float(body.get("delay_s", 1.0)))
        if mode == "drop":
            when = str(body.get("when", "before"))
            if when not in ("before", "after", "mid", "reset"):
                raise ValueError(f"unknown `when` {when!r}")
            return Fault(mode, count, only, when=when)
        if mode == "truncate":
            return Fault(mode, count, only)
        if mode == "drip":
            chunk_bytes = int(body.get("chunk_bytes", 1024))
            if chunk_bytes < 1:
                raise ValueError("`chunk_bytes` must be at least 1")
            delay_s = float(body.get("delay_s", 1.0))
            return Fault(mode, count, only, delay_s=delay_s, chunk_bytes=chunk_bytes)
        raise ValueError(f"unknown mode {mode!r}")


async def _drop(receive: Receive, *, how: str = "abort") -> None:
    """End the connection without a (complete) response, as a flaky network would.

    `how`: "abort" (close at once), "close" (flush what was sent, then FIN)
    or "reset" (a TCP RST). ASGI has no verb for this; uvicorn's receive is
    a method of the request cycle, which holds the transport.
    """
    cycle = getattr(receive, "__self__", None)
    transport = getattr(cycle, "transport", None)
    if transport is None:
        raise RuntimeError("dropping connections needs uvicorn's HTTP/1.1 server")
    if how == "close":
        transport.close()
    else:
        if how == "reset":
            # Linger on, zero seconds: close() sends RST instead of FIN.
            sock = transport.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        transport.abort()
    for _ in range(400):  # let uvicorn see the disconnect, so it logs no error
        if getattr(cycle, "disconnected", True):
            return
        await asyncio.sleep(0.005)


class FrontDoor:
    """Counts, authenticates and misbehaves on demand before any route runs."""

    def __init__(self, app: ASGIApp, provider: DemoProvider) -> None:
        self.app = app
        self.provider = provider

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"].startswith("/__"):
            await self.app(scope, receive, send)
            return
        p = self.provider
        p.stats.requests += 1
        request = Request(scope)
        key = api_key(request.headers)
        vendor, op = operation(scope["method"], scope["path"]) or (OPENAI, "other")
        p.note_arrival(key, vendor)
        fault = p.take_fault(op)
        if fault is not None and fault.mode == "slow":
            await asyncio.sleep(fault.delay_s * p.time_scale)
        if fault is not None and fault.mode == "429_storm":
            refusal = p.too_many(key, vendor, fault.retry_after_s, fault.header, "storm")
            await refusal(scope, receive, send)
            return
        if fault is not None and fault.mode == "5xx":
            status, message = fault.status or 503, "the server is overloaded, retry later"
            if fault.retry_after_s >= 0:
                response = p.refuse(status, key, vendor, fault.retry_after_s, fault.header, message)
            else:
                response = error_response(status, message, "server_error")
            await response(scope, receive, send)
            return
        if fault is not None and fault.mode == "drop" and fault.when == "before":
            await _drop(receive)
            return
        if key is None:
            p.stats.unauthorized += 1
            missing = error_response(
                401, "missing API key: send Authorization: Bearer <key>", "invalid_api_key"
            )
            await missing(scope, receive, send)
            return
        if p.plan.key_revoked(key):
            p.stats.unauthorized += 1
            revoked = error_response(401, "this API key has been revoked", "invalid_api_key")
            await revoked(scope, receive, send)
            return
        if fault is not None and fault.mode == "drop":
            await self._answer_then_drop(scope, receive, send, when=fault.when)
            return
        if fault is not None and fault.mode == "truncate":
            await self._answer_then_drop(scope, receive, send, when="truncate")
            return
        if fault is not None and fault.mode == "drip":
            await self._drip(scope, receive, send, fault)
            return
        await self.app(scope, receive, send)

    async def _answer_then_drop(
        self, scope: Scope, receive: Receive, send: Send, *, when: str
    ) -> None:
        """Do the work (a job may be created), then lose the answer on the wire:
        all of it ("after"), or all but the first half of its body ("mid",
        "reset", "truncate")."""
        body_sent = False

        async def lossy(message: Message) -> None:
            nonlocal body_sent
            if when == "after":
                return
            if message["type"] == "http.response.start":
                await send(message)
            elif message["type"] == "http.response.body" and not body_sent:
                body_sent = True
                body = message.get("body", b"")
                await send(
                    {
                        "type": "http.response.body",
                        "body": body[: len(body) // 2],
                        "more_body": True,
                    }
                )

        await self.app(scope, receive, lossy)
        how = {"truncate": "close", "reset": "reset"}.get(when, "abort")
        await _drop(receive, how=how)

    async def _drip(self, scope: Scope, receive: Receive, send: Send, fault: Fault) -> None:
        """The whole answer, a few bytes at a time."""
        pause_s = fault.delay_s * self.provider.time_scale

        async def dripping(message: Message) -> None:
            if message["type"] != "http.response.body":
                await send(message)
                return
            body = message.get("body", b"")
            pieces = [
                body[i : i + fault.chunk_bytes] for i in range(0, len(body), fault.chunk_bytes)
            ]
            for index, piece in enumerate(pieces):
                if index:
                    await asyncio.sleep(pause_s)
                last = index == len(pieces) - 1
                await send(
                    {
                        "type": "http.response.body",
                        "body": piece,
                        "more_body": message.get("more_body", False) if last else True,
                    }
                )
            if not pieces:
                await send(message)

        await self.app(scope, receive, dripping)
