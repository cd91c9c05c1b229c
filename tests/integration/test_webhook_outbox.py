"""Webhook deliveries kept in the store: across a SIGTERM and a restart, and
listed and redelivered by an operator through the CLI.

The service is a real process (`python -m dispatcher`) on its SQLite file,
stopped with SIGTERM; the receiver is a real HTTP server on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_webhooks import SECRET, Receiver, receiver
from tests.support.servicecli import ServiceProcess, start_service

pytestmark = pytest.mark.timeout(180)


def _env(hook: Receiver) -> dict[str, str]:
    # Real time: the first retry is 2 s away, longer than the stop takes.
    return {
        "DISPATCHER_WEBHOOK_URLS": hook.url,
        "DISPATCHER_WEBHOOK_SECRET": SECRET,
        "DISPATCHER_TIME_SCALE": "1",
    }


async def _cli(service: ServiceProcess, *args: str) -> dict[str, Any]:
    done = await asyncio.to_thread(service.cli, *args, "--json")
    assert done.returncode == 0, (done.stdout, done.stderr)
    return dict(json.loads(done.stdout))


def _answered(hook: Receiver, status: int) -> list[str]:
    """Delivery ids of the requests answered with `status`, in order."""
    return [r["headers"]["x-dispatcher-delivery"] for r in hook.received if r["status"] == status]


async def test_an_event_waiting_for_its_retry_at_sigterm_is_delivered_after_restart(
    tmp_path: Path,
) -> None:
    async with receiver() as hook:
        hook.down = True
        service = await asyncio.to_thread(start_service, tmp_path, env=_env(hook))
        try:
            await _cli(service, "accounts", "disable", "demo", "--reason", "invoice overdue")
            await hook.wait_for(1, "account.state_changed")
        finally:
            assert await asyncio.to_thread(service.stop) == 0
        (event_id,) = set(_answered(hook, 503))  # tried (and refused), then the stop
        assert _answered(hook, 200) == []

        hook.down = False
        service = await asyncio.to_thread(start_service, tmp_path, env=_env(hook))
        try:
            deadline = asyncio.get_running_loop().time() + 60
            while _answered(hook, 200) != [event_id]:
                assert asyncio.get_running_loop().time() < deadline, hook.received
                await asyncio.sleep(0.05)
            told = hook.events("account.state_changed")[-1]["account"]
            assert (told["name"], told["new_state"]) == ("demo", "disabled")

            # A receiver refusing for good (a 4xx) fails the delivery at once;
            # the operator lists it and sends it again once the receiver is fixed.
            hook.statuses = [400]
            await _cli(service, "accounts", "enable", "demo")
            with service.http() as http:
                while not http.get("/v1/webhooks/outbox?state=failed").json()["items"]:
                    assert asyncio.get_running_loop().time() < deadline, hook.received
                    await asyncio.sleep(0.05)
            listed = await _cli(service, "webhooks", "deliveries", "--state", "failed")
            (item,) = listed["items"]
            assert (item["event"], item["attempts"], item["last_status"]) == (
                "account.state_changed",
                1,
                400,
            )
            with service.http() as http:
                view = http.get("/v1/webhooks/deliveries").json()
                metrics = http.get("/metrics").text
            assert (view["failed"], view["dropped"]) == (1, 1)
            assert 'dispatcher_webhook_deliveries_total{result="failed"} 1.0' in metrics
            assert "dispatcher_webhook_dropped_total 1.0" in metrics

            redone = await _cli(service, "webhooks", "redeliver", str(item["id"]))
            assert redone["state"] == "pending"
            while _answered(hook, 200) != [event_id, str(item["event_id"])]:
                assert asyncio.get_running_loop().time() < deadline, hook.received
                await asyncio.sleep(0.05)
            again = await asyncio.to_thread(service.cli, "webhooks", "redeliver", str(item["id"]))
            assert again.returncode != 0 and "no webhook delivery" in again.stderr + again.stdout
        finally:
            assert await asyncio.to_thread(service.stop) == 0
