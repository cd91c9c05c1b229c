"""The dashboard's task page, job gallery and history in a real Chromium.

Results come from the bundled demo web model (`[media=image]`, `[media=video]`)
and demo API; failures from `[mode=error]`, which must leave a screenshot and
the page's HTML that the task page shows and the service serves. Each test
keeps a screenshot of the pages it saw (tests/artifacts/dashboard/).
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

import pytest
from playwright.async_api import Dialog, Page, Route, expect

from tests.e2e.dashboard_browser import Browser, keep_screenshot, sign_in, task_row
from tests.support.harness import Harness, running_service
from tests.support.helpers import traced_demo_profile

pytestmark = [
    pytest.mark.browser,
    pytest.mark.timeout(90),
    pytest.mark.asyncio(loop_scope="module"),
]

expect.set_options(timeout=15_000)

# 15 s heartbeat -> 0.75 s, 90 s stale -> 4.5 s: room for a browser start.
WEB_SCALE = 0.05
WEB = ("demo-chat", "demo-chat-api")


async def natural_width(page: Page, selector: str) -> int:
    """The loaded width of the first image matching; 0 while it has not loaded."""
    image = page.locator(selector).first
    await expect(image).to_be_visible()
    await page.wait_for_function(
        "sel => { const i = document.querySelector(sel); return i && i.complete; }", arg=selector
    )
    return int(await image.evaluate("i => i.naturalWidth"))


async def open_page(h: Harness, page: Page, route: str) -> None:
    await page.goto(f"{h.service.url}/#{route}")


async def test_task_page_shows_what_was_asked_and_the_result(
    tmp_path: Path, browser: Browser
) -> None:
    async with running_service(tmp_path, profiles=WEB, time_scale=WEB_SCALE) as h:
        page = browser.page
        image = await h.submit("demo-chat", "a red square [media=image]", seed=7)
        video = await h.submit("demo-chat", "a short clip [media=video]")
        text = await h.submit("demo-chat-api", "three lines of haiku")
        for task in (image, video, text):
            assert (await h.wait_task(task["id"]))["state"] == "success"
        await sign_in(h, page)

        await open_page(h, page, f"task/{image['id']}")
        await expect(page.get_by_test_id("task-prompt")).to_have_text("a red square [media=image]")
        await expect(page.get_by_test_id("task-params")).to_contain_text("seed")
        await expect(page.get_by_test_id("task-model")).to_have_text("demo-chat")
        await expect(page.get_by_test_id("task-lane")).to_contain_text("web:demo-")
        await expect(page.get_by_test_id("task-job")).to_contain_text("single task")
        assert await natural_width(page, "[data-testid=result-image]") > 0
        download = page.get_by_test_id("result-download")
        assert (await download.get_attribute("href") or "").endswith("/result?file=0")
        await expect(page.get_by_test_id("result-size")).to_contain_text("B")
        await expect(page.get_by_test_id("result-text")).to_contain_text("echo: a red square")
        await expect(page.get_by_test_id("attempt-row")).to_have_count(1)
        await expect(page.get_by_test_id("attempt-row")).to_contain_text("generating")
        await keep_screenshot(page, "task-image")

        await open_page(h, page, f"task/{video['id']}")
        player = page.get_by_test_id("result-video")
        await expect(player).to_be_visible()
        source = await player.get_attribute("src") or ""
        assert source.endswith("/result?file=0")
        served = await page.evaluate(f"fetch('{source}').then(r => r.headers.get('content-type'))")
        assert served == "video/mp4"
        await keep_screenshot(page, "task-video")

        await open_page(h, page, f"task/{text['id']}")
        await expect(page.get_by_test_id("result-text")).to_contain_text("three lines of haiku")
        await expect(page.get_by_test_id("result-image")).to_have_count(0)
        await keep_screenshot(page, "task-text")

        assert browser.problems == []

        await open_page(h, page, "task/0123456789abcdef")
        await expect(page.get_by_test_id("page-error")).to_contain_text("not found")


async def test_job_gallery_fills_in_live_and_a_failure_is_shown(
    tmp_path: Path, browser: Browser
) -> None:
    traced_demo_profile(tmp_path, "demo-traced", ("demo-2",), max_attempts=2)
    async with running_service(
        tmp_path, profiles=WEB, time_scale=WEB_SCALE, retry_delay_s=0.5
    ) as h:
        page = browser.page
        await sign_in(h, page)
        await page.evaluate("window.__no_reload = 7")
        job = await h.job(
            "gallery",
            [
                {"model": "demo-chat", "params": {"prompt": "first [media=image] [duration=20]"}},
                {"model": "demo-chat", "params": {"prompt": "second [media=video] [duration=20]"}},
                {"model": "demo-chat-api", "params": {"prompt": "words only", "gen_s": 40}},
                {"model": "demo-traced", "params": {"prompt": "breaks [mode=error]"}},
            ],
        )
        await page.goto(f"{h.service.url}/#job/{job['id']}")
        await expect(page.get_by_test_id("job-title")).to_contain_text("gallery")
        cards = page.get_by_test_id("gallery-card")
        await expect(cards).to_have_count(4)
        # Opened while the job runs: the cards fill in as tasks finish, no reload.
        assert await page.locator("[data-testid=gallery-card][data-state=success]").count() < 4
        image_id, video_id, text_id, failing_id = (t["id"] for t in job["tasks"])
        card = page.locator(f'[data-testid=gallery-card][data-task-id="{image_id}"]')
        await expect(card).to_have_attribute("data-state", "success", timeout=30_000)
        assert await natural_width(page, f'[data-task-id="{image_id}"] [data-testid=gallery-image]')
        video = page.locator(f'[data-task-id="{video_id}"] [data-testid=gallery-video]')
        await expect(video).to_have_attribute("src", f"/v1/tasks/{video_id}/result?file=0")
        await expect(video).to_have_attribute("preload", "metadata")
        text = page.locator(f'[data-task-id="{text_id}"] [data-testid=gallery-text]')
        await expect(text).to_contain_text("words only")
        failed = page.locator(f'[data-testid=gallery-card][data-task-id="{failing_id}"]')
        await expect(failed).to_have_attribute("data-state", "failed", timeout=30_000)
        await expect(failed.get_by_test_id("gallery-error")).to_contain_text("overloaded")
        lanes = page.get_by_test_id("job-lane-row")
        assert await lanes.count() >= 2
        await expect(page.get_by_test_id("job-lanes")).to_contain_text("api:demo")
        assert await page.evaluate("window.__no_reload") == 7
        await keep_screenshot(page, "job-gallery")

        # The failed task's page: each attempt with what the page looked like.
        await failed.get_by_test_id("task-link").click()
        await expect(page.get_by_test_id("task-failure")).to_contain_text("page_error")
        attempts = page.get_by_test_id("attempt-row")
        await expect(attempts).to_have_count(2)
        await expect(attempts.first.get_by_test_id("evidence-shot")).to_be_visible()
        last = attempts.last
        await expect(last.get_by_test_id("attempt-error")).to_contain_text("overloaded")
        shot = last.get_by_test_id("artifact-screenshot")
        await expect(shot).to_be_visible()
        assert await natural_width(page, "[data-attempt='2'] .evidence-shot") > 100
        html_link = last.get_by_test_id("artifact-html")
        html_url = await html_link.get_attribute("href") or ""
        served = await page.evaluate(
            f"fetch('{html_url}').then(async r => [r.status, r.headers.get('content-type'), "
            "r.headers.get('content-security-policy'), await r.text()])"
        )
        assert served[0] == 200 and served[1].startswith("text/plain")
        assert "sandbox" in served[2] and "error-banner" in served[3]
        trace = last.get_by_test_id("artifact-trace")
        await expect(trace).to_contain_text("trace")
        on_disk = h.state_dir / "results" / failing_id / "attempt-2" / "artifacts"
        assert sorted(p.name for p in on_disk.iterdir()) == [
            "page.html",
            "screenshot.png",
            "trace.zip",
        ]
        await keep_screenshot(page, "task-failed-with-evidence")

        # Retry from the gallery: the task gets another attempt.
        await page.go_back()
        await failed.get_by_test_id("gallery-retry").click()
        await expect(page.get_by_test_id("toast")).to_contain_text("attempt 3 queued")
        assert (await h.task(failing_id))["attempt"] == 3
        assert browser.problems == []


async def test_history_filters_pages_and_remembers(tmp_path: Path, browser: Browser) -> None:
    # At 0.2 the slow task's chat request has 24 real seconds (the profile's
    # 120 s timeout) to stay running while the page is driven, even on a
    # loaded machine; the other tasks still take a fraction of a second.
    async with running_service(tmp_path, concurrency={"demo": 3}, time_scale=0.2) as h:
        page = browser.page
        job = await h.job(
            "nightly posters",
            [
                {"model": "demo-chat-api", "params": {"prompt": f"poster {i}", "gen_s": 1}}
                for i in range(3)
            ],
        )
        single = await h.submit("demo-chat-api", "a lonely question", gen_s=1)
        refused = await h.submit("demo-chat-api", "refused [status=400]")
        await h.wait_job(job["id"])
        for task in (single, refused):
            await h.wait_task(task["id"])
        # A run far past what the model usually takes (its recent runs took 0.02 s).
        slow = await h.submit("demo-chat-api", "slow one", gen_s=3000)
        await h.wait_task(slow["id"], {"running"})
        await sign_in(h, page)

        # The overview: the slow task is overdue, not "0s"; activity from the store.
        row = task_row(page, slow["id"])
        await expect(row.get_by_test_id("task-eta")).to_contain_text("overdue")
        activity = page.get_by_test_id("activity")
        await expect(activity).to_contain_text("failed: http_400")
        await expect(page.get_by_test_id("activity-item")).to_have_count(5)
        await keep_screenshot(page, "overview")

        # Cancel asks first: dismissing keeps the task running.
        answers = iter([False, True])

        async def confirm(dialog: Dialog) -> None:
            assert dialog.type == "confirm" and "Cancel task" in dialog.message
            await (dialog.accept() if next(answers) else dialog.dismiss())

        page.on("dialog", confirm)
        await row.get_by_test_id("task-cancel").click()
        await asyncio.sleep(0.3)
        assert (await h.task(slow["id"]))["state"] == "running"
        await row.get_by_test_id("task-cancel").click()
        assert (await h.wait_task(slow["id"]))["state"] == "canceled"

        # Activity survives a reload: it is read back from the store.
        await page.reload()
        await expect(page.get_by_test_id("live-status")).to_have_attribute("data-live", "yes")
        await expect(page.get_by_test_id("activity-item")).to_have_count(6)
        await expect(activity).to_contain_text("canceled")

        # History of tasks: single ones too, newest first, with created time.
        await page.get_by_test_id("nav-history").click()
        await page.get_by_test_id("history-tab-tasks").click()
        rows = page.get_by_test_id("history-task-row")
        await expect(rows).to_have_count(6)
        first = rows.first
        await expect(first).to_have_attribute("data-task-id", slow["id"])
        await expect(first.get_by_test_id("history-created")).not_to_be_empty()
        lonely = page.locator(f'[data-testid=history-task-row][data-task-id="{single["id"]}"]')
        await expect(lonely).to_contain_text("single")
        await keep_screenshot(page, "history-tasks")

        await page.get_by_test_id("filter-state").select_option("failed")
        await expect(rows).to_have_count(1)
        await expect(rows.first).to_have_attribute("data-task-id", refused["id"])
        # Its page links the provider's last answer, kept when the attempt failed.
        await rows.first.get_by_test_id("task-link").click()
        answer = page.get_by_test_id("view-task").get_by_test_id("artifact-answer")
        await expect(answer).to_contain_text("vendor's last answer")
        await keep_screenshot(page, "task-api-failure")
        await page.go_back()
        await expect(page.get_by_test_id("filter-state")).to_have_value("failed")
        await page.get_by_test_id("filter-state").select_option("")
        await page.get_by_test_id("filter-q").fill("poster 1")
        await page.get_by_test_id("filter-apply").click()
        await expect(rows).to_have_count(1)
        await expect(rows.first).to_contain_text("poster 1")

        # A row opens its task.
        await rows.first.locator("td").nth(4).click()
        await expect(page.get_by_test_id("task-prompt")).to_have_text("poster 1")

        # History of jobs, filtered by name.
        await page.goto(f"{h.service.url}/#history/jobs")
        jobs = page.get_by_test_id("view-history").get_by_test_id("job-row")
        await expect(jobs).to_have_count(1)
        await expect(jobs.first.get_by_test_id("job-created")).not_to_be_empty()
        await keep_screenshot(page, "history-jobs")
        await page.get_by_test_id("filter-q").fill("no such job")
        await page.get_by_test_id("filter-apply").click()
        await expect(page.get_by_test_id("history-empty")).to_be_visible()
        assert browser.problems == []


async def test_pages_read_the_paged_answers_and_the_attempt_history(
    tmp_path: Path, browser: Browser
) -> None:
    """The answers the API is growing into (issue 18): lists as `{"items", "next"}`
    pages, tasks with `ref` and `attempts`, a webhook delivery log. The browser
    reshapes today's real answers on their way in; the page must read both."""
    async with running_service(tmp_path) as h:
        page = browser.page
        tasks = [await h.submit("demo-chat-api", f"poster {i}", gen_s=1) for i in range(3)]
        for task in tasks:
            await h.wait_task(task["id"])
        first = tasks[0]["id"]

        async def paged(route: Route) -> None:
            if route.request.method != "GET":
                await route.continue_()
                return
            # Re-paged by two, with our own cursor: the whole list is fetched
            # without it (the service's own answer may be a page already).
            parts = urlsplit(route.request.url)
            query = parse_qs(parts.query)
            start = int(query.pop("after", ["0"])[0])
            query["limit"] = ["500"]
            response = await route.fetch(
                url=urlunsplit(parts._replace(query=urlencode(query, doseq=True)))
            )
            data = await response.json()
            items = data["items"] if isinstance(data, dict) else data
            items = sorted(items, key=lambda t: -t["created_at"])
            more = start + 2 < len(items)
            body = {"items": items[start : start + 2], "next": str(start + 2) if more else None}
            await route.fulfill(response=response, json=body)

        async def with_history(route: Route) -> None:
            response = await route.fetch()
            task = await response.json()
            task.update(ref="poster-00", attempt=2)
            task["attempts"] = [
                {
                    "attempt": 1,
                    "lane": "api:demo",
                    "owner": "demo",
                    "outcome": "pending",
                    "started_at": task["started_at"],
                    "ended_at": task["started_at"],
                    "error": {"kind": "http_503", "message": "the vendor is busy"},
                    "stage_durations": {"generating": 0.4},
                },
                {
                    "attempt": 2,
                    "lane": "api:demo",
                    "owner": "demo",
                    "outcome": "success",
                    "started_at": task["started_at"],
                    "ended_at": task["finished_at"],
                    "error": None,
                    "stage_durations": task["stage_durations"],
                },
            ]
            await route.fulfill(response=response, json=task)

        async def with_webhooks(route: Route) -> None:
            response = await route.fetch()
            doc = await response.json()
            doc["paths"]["/v1/webhooks/deliveries"] = {"get": {}}
            await route.fulfill(response=response, json=doc)

        deliveries = {
            "urls": ["https://hooks.example/…"],
            "queued": 0,
            "delivering": 0,
            "dropped": 0,
            "items": [
                {
                    "event": "job.finished",
                    "url": "https://hooks.example/…",
                    "attempt": 2,
                    "at": tasks[0]["created_at"],
                    "status": 200,
                    "ok": True,
                    "error": None,
                    "duration_ms": 12.5,
                    "final": True,
                },
                {
                    "event": "job.finished",
                    "url": "https://hooks.example/…",
                    "attempt": 1,
                    "at": tasks[0]["created_at"],
                    "status": 500,
                    "ok": False,
                    "error": "HTTP 500",
                    "duration_ms": 8.0,
                    "final": False,
                },
            ],
        }
        await page.route(re.compile(r"/v1/(tasks|jobs)\?"), paged)
        await page.route(re.compile(rf"/v1/tasks/{first}$"), with_history)
        await page.route(re.compile(r"/openapi\.json$"), with_webhooks)
        await page.route(
            re.compile(r"/v1/webhooks/deliveries$"), lambda route: route.fulfill(json=deliveries)
        )
        await sign_in(h, page)

        log = page.get_by_test_id("webhooks")
        await expect(log).to_be_visible()
        await expect(log.get_by_test_id("delivery-row")).to_have_count(2)
        await expect(log.get_by_test_id("delivery-row").last).to_contain_text("will retry")
        await expect(page.get_by_test_id("activity-item")).to_have_count(2)  # one page of it

        await open_page(h, page, "history/tasks")
        rows = page.get_by_test_id("history-task-row")
        await expect(rows).to_have_count(2)
        await page.get_by_test_id("history-more").click()
        await expect(rows).to_have_count(3)
        await expect(page.get_by_test_id("history-more")).to_be_hidden()

        await open_page(h, page, f"task/{first}")
        await expect(page.get_by_test_id("task-ref")).to_have_text("poster-00")
        attempts = page.get_by_test_id("attempt-row")
        await expect(attempts).to_have_count(2)
        await expect(attempts.first).to_contain_text("failed, retried")
        await expect(attempts.first).to_contain_text("the vendor is busy")
        await expect(attempts.last).to_contain_text("success")
        await keep_screenshot(page, "task-with-attempt-history")
        assert browser.problems == []
