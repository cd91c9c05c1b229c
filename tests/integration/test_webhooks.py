"""Webhooks against a real local receiver that checks every signature."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from dispatcher.errors import ConfigError
from dispatcher.notify.webhooks import MAX_ATTEMPTS, check_urls, display_url
from dispatcher.service.serving import start_server
from dispatcher.settings import Settings
from tests.support.harness import running_service

SECRET = "whsec-test-0123456789abcdef"


@dataclass
class Receiver:
    """An operator's endpoint: answers from `statuses` in turn (then 200); 503
    to everything while `down`."""

    url: str = ""
    statuses: list[int] = field(default_factory=list)
    down: bool = False
    received: list[dict[str, Any]] = field(default_factory=list)
    bad_signatures: int = 0

    async def handle(self, request: Request) -> Response:
        raw = await request.body()
        expected = "sha256=" + hmac.new(SECRET.encode(), raw, hashlib.sha256).hexdigest()
        if not hmac.compare_digest(request.headers.get("x-dispatcher-signature", ""), expected):
            self.bad_signatures += 1
            return Response(status_code=401)
        body = json.loads(raw)
        status = 503 if self.down else self.statuses.pop(0) if self.statuses else 200
        self.received.append({"headers": dict(request.headers), "body": body, "status": status})
        return Response(status_code=status)

    def events(self, kind: str) -> list[dict[str, Any]]:
        """Bodies of `kind` that were answered 2xx or not: each delivery attempt once."""
        return [r["body"] for r in self.received if r["body"]["event"] == kind]

    async def wait_for(self, count: int, kind: str, timeout_s: float = 20.0) -> None:
        deadline = asyncio.get_running_loop().time() + timeout_s
        while len(self.events(kind)) < count:
            assert asyncio.get_running_loop().time() < deadline, self.received
            await asyncio.sleep(0.02)


@asynccontextmanager
async def receiver() -> AsyncIterator[Receiver]:
    hook = Receiver()
    server = await start_server(
        Starlette(routes=[Route("/hook", hook.handle, methods=["POST"])]), None
    )
    hook.url = f"{server.url}/hook?token=receiver-side-secret"
    try:
        yield hook
    finally:
        await server.stop()


async def _deliveries(h: Any) -> dict[str, Any]:
    response = await h.http.get("/v1/webhooks/deliveries")
    assert response.status_code == 200
    return dict(response.json())


async def _drained(h: Any, timeout_s: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        log = await _deliveries(h)
        if log["queued"] == 0 and log["delivering"] == 0:
            return
        assert asyncio.get_running_loop().time() < deadline, log
        await asyncio.sleep(0.02)


async def test_job_finished_is_signed_retried_and_told_once(tmp_path: Path) -> None:
    async with (
        receiver() as hook,
        running_service(tmp_path, webhook_urls=[hook.url], webhook_secret=SECRET) as h,
    ):
        hook.statuses = [503]  # the first delivery fails and is retried
        tasks = [
            {"model": "demo-chat-api", "ref": "ok", "params": {"prompt": "fine", "gen_s": 1}},
            {"model": "demo-chat-api", "ref": "bad", "params": {"prompt": "no [status=400]"}},
        ]
        job = await h.job("notified", tasks)
        await h.wait_job(job["id"])
        await hook.wait_for(2, "job.finished")
        first, retried = hook.received[:2]
        assert first["body"] == retried["body"]  # the same event, signed the same way
        assert first["headers"]["x-dispatcher-delivery"] == first["body"]["id"]
        assert first["headers"]["x-dispatcher-event"] == "job.finished"
        assert first["headers"]["x-dispatcher-timestamp"] == str(first["body"]["timestamp"])
        told = first["body"]["job"]
        assert (told["id"], told["name"], told["state"]) == (job["id"], "notified", "partial")
        assert told["counts"]["success"] == 1 and told["counts"]["failed"] == 1
        assert told["total"] == 2 and told["elapsed_s"] >= 0
        (failed,) = told["failed"]
        assert failed["ref"] == "bad" and failed["error"]["kind"] == "http_400"

        log = await _deliveries(h)
        assert log["urls"] == [display_url(hook.url)] and "receiver-side-secret" not in str(log)
        newest, oldest = log["items"][:2]
        assert (oldest["attempt"], oldest["status"], oldest["ok"], oldest["final"]) == (
            1,
            503,
            False,
            False,
        )
        assert (newest["attempt"], newest["status"], newest["ok"], newest["final"]) == (
            2,
            200,
            True,
            True,
        )

        # A job answered wholly from the cache finishes as it is created: told once.
        cached = await h.job("cached", [tasks[0]])
        assert cached["state"] == "success" and cached["from_cache"] == 1
        await hook.wait_for(3, "job.finished")
        # A retried job that finishes again is told again.
        await h.http.post(f"/v1/jobs/{job['id']}/retry")
        await h.wait_job(job["id"])
        await hook.wait_for(4, "job.finished")
        await _drained(h)  # every event heard so far is handled: no duplicate can follow
        finished = [b["job"]["name"] for b in hook.events("job.finished")]
        assert finished == ["notified", "notified", "cached", "notified"]
        assert hook.bad_signatures == 0


async def test_account_changes_are_told_and_a_dead_endpoint_never_blocks_tasks(
    tmp_path: Path,
) -> None:
    # A port nobody answers on, held for the whole test: bound, never
    # listening (a connect is refused), and without SO_REUSEADDR, so no other
    # server can take it meanwhile (a port closed at once was, once, by
    # another test's server, which answered 401).
    dead_socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    dead_socket.bind(("127.0.0.1", 0))
    dead_url = f"http://127.0.0.1:{dead_socket.getsockname()[1]}/gone"
    with closing(dead_socket):
        async with (
            receiver() as hook,
            running_service(
                tmp_path, webhook_urls=[dead_url, hook.url], webhook_secret=SECRET
            ) as h,
        ):
            await h.http.post("/v1/accounts/demo/disable", json={"reason": "invoice overdue"})
            await h.http.post("/v1/accounts/demo/enable")
            await hook.wait_for(2, "account.state_changed")
            off, on = (b["account"] for b in hook.events("account.state_changed"))
            assert off == {
                "name": "demo",
                "kind": "api",
                "old_state": "ok",
                "new_state": "disabled",
                "reason": "invoice overdue",
                "until": None,
            }
            assert (on["old_state"], on["new_state"], on["reason"]) == ("disabled", "ok", None)

            # Tasks run on while one endpoint is down and its deliveries retry.
            job = await h.job(
                "meanwhile", [{"model": "demo-video", "params": {"prompt": "x", "gen_s": 1}}]
            )
            assert (await h.wait_job(job["id"]))["state"] == "success"
            await hook.wait_for(1, "job.finished")

            deadline = asyncio.get_running_loop().time() + 20
            while True:
                items = (await _deliveries(h))["items"]
                given_up = [i for i in items if i["url"] == dead_url and i["final"]]
                if len(given_up) == 3 or asyncio.get_running_loop().time() > deadline:
                    break
                await asyncio.sleep(0.05)
            assert len(given_up) == 3, items  # two account changes and the job, each given up
            assert all(i["attempt"] == MAX_ATTEMPTS and i["status"] is None for i in given_up)
            assert all("ConnectError" in i["error"] for i in given_up)
            assert len([i for i in items if i["url"] == dead_url]) == 3 * MAX_ATTEMPTS


async def test_webhooks_are_off_without_urls(tmp_path: Path) -> None:
    async with running_service(tmp_path) as h:
        assert await _deliveries(h) == {
            "urls": [],
            "queued": 0,
            "delivering": 0,
            "failed": 0,
            "dropped": 0,
            "items": [],
        }


def test_urls_need_a_secret_and_a_web_scheme() -> None:
    assert check_urls([], None) == []
    with pytest.raises(ConfigError, match="DISPATCHER_WEBHOOK_SECRET must be set"):
        check_urls(["https://hooks.example/x"], None)
    with pytest.raises(ConfigError, match="DISPATCHER_WEBHOOK_SECRET must be set"):
        check_urls(["https://hooks.example/x"], "short")
    with pytest.raises(ConfigError, match="must be http"):
        check_urls(["ftp://hooks.example/x"], SECRET)
    assert display_url("https://u:p@hooks.example:8443/in?key=s") == "https://hooks.example:8443/in"


def test_the_setting_takes_a_list_in_several_spellings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISPATCHER_WEBHOOK_URLS", "https://a.example/h, https://b.example/h")
    assert Settings().webhook_urls == ["https://a.example/h", "https://b.example/h"]
    monkeypatch.setenv("DISPATCHER_WEBHOOK_URLS", '["https://c.example/h"]')
    assert Settings().webhook_urls == ["https://c.example/h"]
