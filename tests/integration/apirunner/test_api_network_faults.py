"""Network faults between the service and the demo vendor, in the real service.

Connections reset or cut short mid-download, a body that drips, the vendor
down while a job is polled, at submit, or for good. What must hold every
time: the right retries (the download or the poll again, never the submit),
no second job at the vendor for one task (its own counters), and no task
lost: each ends in success, or failed with a clear error when the fault
does not go away.
"""

from __future__ import annotations

import asyncio
import hashlib
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from demo.api_provider import png_bytes, video_bytes
from dispatcher.service.serving import start_server
from tests.support.harness import Harness, running_service

# Nominal seconds x 0.02: a 100 s generation takes 2 s, retry delays 0.1 s.
SCALE = 0.02


@dataclass
class Vendor:
    """The service's demo vendor, to be taken down and brought back on its port.

    Its state (jobs, counters) lives in the app and survives, like a vendor
    whose front end went away while its workers carried on.
    """

    h: Harness
    app: Any = None
    port: int = 0
    # Holds the port while the vendor is down: bound, not listening, so a
    # connection is refused as before, and no other test's outgoing socket
    # can take the port as its ephemeral one meanwhile (then `up` failed
    # with "Address already in use").
    reserved: socket.socket | None = None

    async def down(self) -> None:
        running = self.h.service.demo_servers[0]
        self.app, self.port = running.server.config.app, running.port
        await running.stop()
        self.reserved = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.reserved.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.reserved.bind(("127.0.0.1", self.port))

    def release(self) -> None:
        if self.reserved is not None:
            self.reserved.close()
            self.reserved = None

    async def up(self) -> None:
        self.release()
        self.h.service.demo_servers[0] = await start_server(self.app, self.port)


@pytest.fixture
def vendor_of() -> Iterator[Callable[[Harness], Vendor]]:
    """Vendors whose reserved port is released even when a test fails while down."""
    made: list[Vendor] = []

    def make(h: Harness) -> Vendor:
        made.append(Vendor(h))
        return made[-1]

    yield make
    for vendor in made:
        vendor.release()


def read_result(task: dict[str, Any]) -> bytes:
    [file] = task["result"]["files"]
    data = Path(file["path"]).read_bytes()
    assert hashlib.sha256(data).hexdigest() == file["sha256"]
    assert len(data) == file["size"]
    return data


def assert_one_job_each(stats: dict[str, Any], tasks: int) -> None:
    """The vendor made exactly one job per task, and was never asked twice for one."""
    assert stats["jobs_created"] == tasks, stats
    assert stats["duplicate_submits"] == 0, stats


@pytest.mark.parametrize("fault", [{"mode": "drop", "when": "reset"}, {"mode": "truncate"}])
async def test_a_download_cut_short_is_fetched_again_never_resubmitted(
    tmp_path: Path, fault: dict[str, Any]
) -> None:
    async with running_service(tmp_path, time_scale=SCALE) as h:
        # Two broken downloads for each model: the video's /content and the
        # image's file URL handed back by the queue API.
        await h.demo_mode({**fault, "only": "content", "count": 4})
        video = await h.submit("demo-video", "cut short", gen_s=2)
        image = await h.submit("demo-queue", "cut short", gen_s=2)
        done_video = await h.wait_task(video["id"])
        done_image = await h.wait_task(image["id"])
        assert (done_video["state"], done_image["state"]) == ("success", "success")
        assert done_video["attempt"] == done_image["attempt"] == 1
        assert read_result(done_video) == video_bytes("cut short")
        assert read_result(done_image) == png_bytes("cut short")
        stats = await h.demo_stats()
        assert stats["faults"] == 4
        assert stats["downloads"] == 6  # 4 cut short + 2 whole
        assert stats["submits"] == 2
        assert_one_job_each(stats, 2)
        # Nothing half-written is left beside the results.
        leftovers = [p for p in (h.state_dir / "results").rglob("*") if p.name.endswith(".part")]
        assert leftovers == []


async def test_a_slow_drip_completes_and_a_stalled_one_is_fetched_again(tmp_path: Path) -> None:
    # Reads time out after 1 s of silence: five times the steady drip's gap,
    # so a busy machine's pause (0.3 s and more at load 20 on two cores, the
    # vendor sharing the service's event loop) is not taken for a stall.
    async with running_service(tmp_path, time_scale=SCALE, http_timeout_s=1.0) as h:
        # Slow but steady: 4 KiB every 0.2 s. Stalled: one 4 KiB piece every
        # 3 s, and the read timeout gives up on it (then a whole download).
        await h.demo_mode(
            {"mode": "drip", "only": "content", "count": 1, "chunk_bytes": 4096, "delay_s": 10}
        )
        steady = await h.submit("demo-video", "steady drip", gen_s=1)
        done = await h.wait_task(steady["id"])
        assert done["state"] == "success" and done["attempt"] == 1
        assert read_result(done) == video_bytes("steady drip")
        assert (await h.demo_stats())["downloads"] == 1

        await h.demo_mode(
            {"mode": "drip", "only": "content", "count": 1, "chunk_bytes": 4096, "delay_s": 150}
        )
        stalled = await h.submit("demo-video", "stalled drip", gen_s=1)
        done = await h.wait_task(stalled["id"])
        assert done["state"] == "success" and done["attempt"] == 1
        assert read_result(done) == video_bytes("stalled drip")
        stats = await h.demo_stats()
        assert stats["downloads"] == 3
        assert_one_job_each(stats, 2)


async def test_a_vendor_down_while_its_job_is_polled_is_polled_again(
    tmp_path: Path, vendor_of: Callable[[Harness], Vendor]
) -> None:
    async with running_service(tmp_path, time_scale=SCALE) as h:
        vendor = vendor_of(h)
        tasks = [
            (await h.submit(model, "through an outage", gen_s=100))["id"]
            for model in ("demo-video", "demo-queue")
        ]
        for task_id in tasks:
            await h.wait_remote_id(task_id)
        await vendor.down()
        # 1 s real = 50 nominal seconds without an answer (connection refused).
        await asyncio.sleep(1.0)
        assert [(await h.task(t))["state"] for t in tasks] == ["running", "running"]
        await vendor.up()
        done = [await h.wait_task(t) for t in tasks]
        assert [t["state"] for t in done] == ["success", "success"]
        assert [t["attempt"] for t in done] == [1, 1]
        stats = await h.demo_stats()
        assert stats["submits"] == 2
        assert_one_job_each(stats, 2)
        metrics = (await h.http.get("/metrics")).text
        assert 'dispatcher_remote_requests_total{provider="demo",status="error"}' in metrics


async def test_a_vendor_down_at_submit_is_retried_until_it_is_back(
    tmp_path: Path, vendor_of: Callable[[Harness], Vendor]
) -> None:
    async with running_service(tmp_path, time_scale=SCALE) as h:
        vendor = vendor_of(h)
        await vendor.down()
        tasks = [
            (await h.submit(model, "while it was down", gen_s=2))["id"]
            for model in ("demo-chat-api", "demo-video", "demo-queue")
        ]
        await asyncio.sleep(0.3)  # a few refused connections
        await vendor.up()
        done = [await h.wait_task(t) for t in tasks]
        assert [t["state"] for t in done] == ["success"] * 3, done
        stats = await h.demo_stats()
        assert stats["chat_completions"] == 1
        assert_one_job_each(stats, 2)
        metrics = (await h.http.get("/metrics")).text
        assert 'dispatcher_remote_requests_total{provider="demo",status="error"}' in metrics


async def test_a_vendor_gone_for_good_fails_each_task_with_a_clear_error(
    tmp_path: Path, vendor_of: Callable[[Harness], Vendor]
) -> None:
    async with running_service(tmp_path, time_scale=SCALE) as h:
        vendor = vendor_of(h)
        await vendor.down()
        tasks = [
            (await h.submit(model, "nobody answers", gen_s=2))["id"]
            for model in ("demo-chat-api", "demo-video", "demo-queue")
        ]
        done = [await h.wait_task(t) for t in tasks]
        for task in done:
            assert task["state"] == "failed", task
            assert task["attempt"] == task["max_attempts"]  # every attempt, then no more
            assert task["error"]["kind"] == "connect"
            assert "ConnectError" in task["error"]["message"]
        await vendor.up()
        stats = await h.demo_stats()
        assert stats["requests"] == 0 and stats["jobs_created"] == 0
        # Still serving, and the next task goes through.
        again = await h.submit("demo-chat-api", "back again")
        assert (await h.wait_task(again["id"]))["state"] == "success"
