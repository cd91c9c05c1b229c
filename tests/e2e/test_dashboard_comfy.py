"""A ComfyUI render in a real Chromium: the task page shows percentage and
the running node while it runs, and the provider shows an outage (issue 28,
findings 3 and 4)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from playwright.async_api import expect

from demo.comfyui import ComfyServer
from tests.e2e.dashboard_browser import Browser, keep_screenshot, sign_in
from tests.support.harness import running_service

pytestmark = [
    pytest.mark.browser,
    pytest.mark.timeout(90),
    pytest.mark.asyncio(loop_scope="module"),
]

expect.set_options(timeout=15_000)


async def test_the_task_page_shows_percentage_and_node_while_a_comfyui_prompt_runs(
    tmp_path: Path, browser: Browser
) -> None:
    async with running_service(tmp_path, profiles=("demo-comfy",)) as h:
        page = browser.page
        # 6,000 steps of 4 ms: long enough for the page's 2 s refresh to see it move.
        task = await h.submit("demo-comfy", "a long render", steps=6000)
        await sign_in(h, page)
        await page.goto(f"{h.service.url}/#task/{task['id']}")
        stage = page.get_by_test_id("task-stage-fact")
        pattern = re.compile(r"^generating (\d+)% · node 3 \(KSampler\)$")
        await expect(stage).to_have_text(pattern)
        first = int(pattern.match(await stage.inner_text()).group(1))  # type: ignore[union-attr]
        # It moves without a reload, and the ETA follows it (never "overdue").
        await expect(stage).not_to_have_text(f"generating {first}% · node 3 (KSampler)")
        eta = page.get_by_test_id("task-head").get_by_test_id("task-eta")
        await expect(eta).to_have_text(re.compile(r"^\d+(m \d+)?s$"))
        await keep_screenshot(page, "task-comfyui-running")
        response = await h.http.post(f"/v1/tasks/{task['id']}/cancel")
        assert response.status_code == 200
        assert (await h.wait_task(task["id"]))["state"] == "canceled"

        # The server stops answering: the provider says since when, and
        # the shot waits for it (no attempt spent) and renders once it is back.
        (comfy,) = [s for s in h.service.demo_servers if isinstance(s, ComfyServer)]
        await comfy.go_down()
        shot = await h.submit("demo-comfy", "after the outage", steps=2)
        await page.goto(f"{h.service.url}/#")
        provider = page.locator('[data-testid=account-row][data-account="demo-comfy"]')
        await expect(provider).to_have_attribute("data-state", "unreachable")
        await expect(provider.get_by_test_id("account-status")).to_contain_text("unreachable since")
        await keep_screenshot(page, "provider-unreachable")
        await comfy.come_back()
        done = await h.wait_task(shot["id"])
        assert done["state"] == "success" and done["attempt"] == 1
        await expect(provider).to_have_attribute("data-state", "ok")
        assert browser.problems == []
