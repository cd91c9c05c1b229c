"""The dashboard of one of several hosts sharing a database, in a real Chromium.

Host A's dashboard lists both hosts (alive, running tasks), and a result
host B made is shown as "on host host-b" on the task page and in the job
gallery: no broken image, no 409 in the browser console.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.async_api import expect

from tests.e2e.dashboard_browser import Browser, keep_screenshot, sign_in
from tests.support.harness import host_service
from tests.support.pgdb import migrated_database

pytestmark = [
    pytest.mark.browser,
    pytest.mark.timeout(120),
    pytest.mark.asyncio(loop_scope="module"),
]

expect.set_options(timeout=15_000)

SCALE = 0.2


async def test_another_hosts_result_is_said_to_be_there_and_the_hosts_are_listed(
    tmp_path: Path, browser: Browser
) -> None:
    with migrated_database() as url:
        async with (
            host_service(tmp_path, "host-a", ("demo-chat-api",), url, SCALE) as a,
            host_service(tmp_path, "host-b", ("demo-video",), url, SCALE) as b,
        ):
            job = await b.job(
                "clips", [{"model": "demo-video", "params": {"prompt": "a clip", "gen_s": 1}}]
            )
            assert (await b.wait_job(job["id"]))["state"] == "success"
            (clip,) = job["tasks"]
            slow = await b.submit("demo-video", "a slow pan", gen_s=600)
            await b.wait_task(slow["id"], {"running"})

            page = browser.page
            await sign_in(a, page)
            hosts = page.get_by_test_id("hosts")
            await expect(hosts).to_be_visible()
            row_b = page.locator("[data-testid=host-row][data-host=host-b]")
            await expect(row_b).to_have_attribute("data-state", "alive")
            await expect(row_b.get_by_test_id("host-running")).to_have_text("1")
            await expect(page.locator("[data-testid=host-row][data-host=host-a]")).to_contain_text(
                "this host"
            )
            await keep_screenshot(page, "hosts-panel")

            await page.goto(f"{a.service.url}/#task/{clip['id']}")
            await expect(page.get_by_test_id("task-host")).to_have_text("host-b")
            await expect(page.get_by_test_id("result-elsewhere")).to_contain_text("on host host-b")
            assert await page.get_by_test_id("result-video").count() == 0
            await keep_screenshot(page, "task-on-another-host")

            await page.goto(f"{a.service.url}/#job/{job['id']}")
            await expect(page.get_by_test_id("gallery-elsewhere")).to_contain_text("host-b")
            assert await page.get_by_test_id("gallery-video").count() == 0

            # B's own dashboard plays it.
            await sign_in(b, page)
            await page.goto(f"{b.service.url}/#task/{clip['id']}")
            await expect(page.get_by_test_id("result-video")).to_be_visible()
            await expect(page.get_by_test_id("task-host")).to_have_text("host-b")
            assert browser.problems == []
