"""Account states on the dashboard: a revoked key and a cooldown show with
their reason and time, live (SSE), in a real headless Chromium."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
from playwright.async_api import expect

from tests.e2e.dashboard_browser import Browser, sign_in
from tests.support.harness import running_service

pytestmark = [
    pytest.mark.browser,
    pytest.mark.timeout(120),
    pytest.mark.asyncio(loop_scope="module"),
]

expect.set_options(timeout=15_000)


async def test_states_show_with_reason_and_time(tmp_path: Path, browser: Browser) -> None:
    async with running_service(tmp_path) as h:
        page = browser.page
        await sign_in(h, page)
        account = page.locator('[data-testid=account-row][data-account="demo"]')
        await expect(account).to_have_attribute("data-state", "ok")

        async with httpx.AsyncClient() as client:
            (await client.post(f"{h.demo_api}/__keys/revoke")).raise_for_status()
            await h.submit("demo-chat-api", "meets a revoked key")
            await expect(account).to_have_attribute("data-state", "needs_attention")
            await expect(account.get_by_test_id("account-status")).to_have_text("needs attention")
            await expect(account.get_by_test_id("account-reason")).to_contain_text("HTTP 401")
            lane = page.locator('[data-testid=lane-row][data-lane="api:demo"]')
            await expect(lane.get_by_test_id("lane-enabled")).to_have_attribute(
                "data-state", "needs_attention"
            )
            (await client.post(f"{h.demo_api}/__keys/restore")).raise_for_status()

        await h.http.post("/v1/accounts/demo/enable")
        await expect(account).to_have_attribute("data-state", "ok")
        # A cooldown (as a usage cap leaves a web account) shows until when.
        await h.service.accounts.cool_down("demo-queue", time.time() + 3600, "usage limit: test")
        queue = page.locator('[data-testid=account-row][data-account="demo-queue"]')
        await expect(queue).to_have_attribute("data-state", "cooldown")
        await expect(queue.get_by_test_id("account-status")).to_contain_text("cooldown until")
        await expect(queue.get_by_test_id("account-reason")).to_have_text("usage limit: test")
        assert browser.problems == []
