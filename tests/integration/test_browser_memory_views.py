"""The browser memory budget as an operator sees it: `/metrics`, the lanes API
and `dispatcher lanes`, with the web accounts' real browsers open."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from tests.support.harness import running_service
from tests.support.servicecli import clean_env, run_cli

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]

REPO = Path(__file__).resolve().parents[2]
MB = 1024**2
BUDGET_MB = 7_000
# A Chromium on the demo page holds ~240 MB of PSS; far less is not a browser's tree.
BROWSER_FLOOR_MB = 50


def gauge(text: str, name: str, labels: str = "") -> float:
    found = re.search(rf"^{name}{re.escape(labels)} (\S+)$", text, re.M)
    assert found, f"{name}{labels} not in /metrics"
    return float(found.group(1))


async def test_the_budget_and_each_open_browser_show_in_metrics_lanes_and_the_cli(
    tmp_path: Path,
) -> None:
    async with running_service(
        tmp_path, profiles=("demo-chat",), time_scale=0.05, browser_memory_mb=BUDGET_MB
    ) as h:
        await h.browsers_started()
        done = await h.wait_task((await h.submit("demo-chat", "hello [duration=1]"))["id"])
        assert done["state"] == "success"
        metrics = (await h.http.get("/metrics")).text
        assert gauge(metrics, "dispatcher_browser_memory_budget_bytes") == BUDGET_MB * MB
        service_bytes = gauge(metrics, "dispatcher_service_memory_bytes")
        assert service_bytes > BROWSER_FLOOR_MB * MB  # Python and the Playwright driver
        for account in ("demo-1", "demo-2"):
            held = gauge(metrics, "dispatcher_browser_memory_bytes", f'{{owner="{account}"}}')
            assert held > BROWSER_FLOOR_MB * MB
        lanes = {lane["name"]: lane for lane in (await h.http.get("/v1/lanes")).json()}
        for account in ("demo-1", "demo-2"):
            lane = lanes[f"web:{account}"]
            assert lane["browser_memory_budget_mb"] == BUDGET_MB
            assert lane["browser_memory_mb"] > BROWSER_FLOOR_MB
        env = clean_env({"DISPATCHER_STATE_DIR": str(h.state_dir)})
        shown = await asyncio.to_thread(run_cli, ["lanes"], env, REPO)
        assert shown.returncode == 0, shown.stderr
        assert f"of a {BUDGET_MB:,} MB budget" in shown.stdout
        rows = [line for line in shown.stdout.splitlines() if "web:demo-" in line]
        assert len(rows) == 2 and all(re.search(r"\d+ MB", row) for row in rows), shown.stdout

        # A browser closed (the account disabled) leaves the gauges and the lanes.
        await h.http.post("/v1/accounts/demo-2/disable", json={"reason": "test"})
        deadline = asyncio.get_running_loop().time() + 30
        while 'owner="demo-2"' in (await h.http.get("/metrics")).text:
            assert asyncio.get_running_loop().time() < deadline, "demo-2's browser still counted"
            await asyncio.sleep(0.1)
        lanes = {lane["name"]: lane for lane in (await h.http.get("/v1/lanes")).json()}
        assert lanes["web:demo-2"]["browser_memory_mb"] is None
