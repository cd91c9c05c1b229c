"""The dashboard with 10,000 waiting tasks, in a real Chromium: counts per queue,
the next tasks to run, and a job page that pages and filters on the service.

Time to first paint of the job page is measured against a one-task job's on
the same machine (a relative bound; the figures are printed for the report).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from playwright.async_api import Page, expect

from dispatcher.tasks.spec import parse_job
from tests.e2e.dashboard_browser import Browser, keep_screenshot, sign_in, task_row
from tests.support.harness import Harness, running_service

pytestmark = [
    pytest.mark.browser,
    pytest.mark.timeout(240),
    pytest.mark.asyncio(loop_scope="module"),
]
expect.set_options(timeout=30_000)

BIG_JOB = 10_000


async def job_of(h: Harness, name: str, size: int) -> str:
    """A job of waiting tasks written through the ledger, as POST /v1/jobs would."""
    tasks = [
        {"model": "demo-video", "ref": f"shot-{n:05d}", "params": {"prompt": f"p{n}", "gen_s": 9e5}}
        for n in range(size)
    ]
    _, specs = parse_job({"name": name, "tasks": tasks})
    job, _ = await h.service.ledger.create_job(name, specs)
    return job.id


async def first_paint_s(h: Harness, page: Page, job_id: str) -> float:
    """From opening the job page to its first task rows on screen."""
    await page.goto(f"{h.service.url}/#history/jobs")
    started = time.perf_counter()
    await page.goto(f"{h.service.url}/#job/{job_id}")
    await expect(page.get_by_test_id("job-tasks").get_by_test_id("task-row").first).to_be_visible()
    return time.perf_counter() - started


async def test_ten_thousand_waiting_tasks_page_on_the_service(
    tmp_path: Path, browser: Browser
) -> None:
    async with running_service(tmp_path, concurrency={"demo": 1}) as h:
        page = browser.page
        small = await job_of(h, "one", 1)
        big = await job_of(h, "big", BIG_JOB)
        await sign_in(h, page)

        # The overview: counts per queue, and the next tasks to run (oldest first).
        queue = page.locator("[data-testid=queue-count]")
        await expect(queue.first).to_contain_text("waiting")
        waiting = (await h.http.get("/v1/queues")).json()
        assert sum(q["waiting"] for q in waiting) >= BIG_JOB - 1
        next_up = (await h.http.get(f"/v1/jobs/{big}/tasks?state=pending&limit=1")).json()["items"][
            0
        ]
        await expect(task_row(page, next_up["id"])).to_be_visible()
        await expect(page.get_by_test_id("next-note")).to_contain_text("the next 20 to run")
        assert await page.locator("[data-testid=tasks] [data-testid=task-row]").count() <= 120
        await keep_screenshot(page, "overview-10000-waiting")

        small_s = await first_paint_s(h, page, small)
        big_s = await first_paint_s(h, page, big)
        height = await page.evaluate("document.documentElement.scrollHeight")
        print(
            f"\njob page first paint: {big_s * 1000:.0f} ms with {BIG_JOB} tasks, "
            f"{small_s * 1000:.0f} ms with 1; page height {height} px"
        )
        # Before: all 10,000 rows, 98,000 px tall.
        rows = page.get_by_test_id("job-tasks").get_by_test_id("task-row")
        await expect(rows).to_have_count(100)
        assert height < 20_000
        assert big_s < max(5.0, 10 * small_s)
        view = page.get_by_test_id("view-job")
        await expect(view.get_by_test_id("job-progress-label")).to_contain_text(f"/{BIG_JOB}")
        await expect(page.get_by_test_id("job-tasks-count")).to_contain_text("tasks 1–100")

        # Paging: the next hundred, and back.
        await page.get_by_test_id("job-tasks-older").click()
        await expect(page.get_by_test_id("job-tasks-count")).to_contain_text("tasks 101–200")
        await page.get_by_test_id("job-tasks-newer").click()
        await expect(page.get_by_test_id("job-tasks-count")).to_contain_text("tasks 1–100")

        # Filters go to the service: by ref, then by state.
        await page.get_by_test_id("job-filter-ref").fill("shot-0999")
        await page.get_by_test_id("job-filter-apply").click()
        await expect(rows).to_have_count(10)
        await page.get_by_test_id("job-filter-ref").fill("")
        await page.get_by_test_id("job-filter-state").select_option("success")
        await page.get_by_test_id("job-filter-apply").click()
        await expect(page.get_by_test_id("job-tasks-empty")).to_be_visible()
        await expect(rows).to_have_count(0)
        await keep_screenshot(page, "job-10000-filtered")
        assert browser.problems == []
