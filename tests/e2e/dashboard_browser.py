"""Driving the dashboard in a real Chromium: signing in, finding rows, keeping screenshots."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from playwright.async_api import Locator, Page, expect

from tests.support.harness import Harness
from tests.support.helpers import REPO

# Screenshots of each page, for a person to review after the run (ignored by git).
SCREENSHOTS_DIR = REPO / "tests" / "artifacts" / "dashboard"


@dataclass
class Browser:
    page: Page
    problems: list[str] = field(default_factory=list)


async def sign_in(h: Harness, page: Page, path: str = "/") -> None:
    code = (await h.http.post("/v1/dashboard-code")).json()["code"]
    response = await page.goto(f"{h.service.url}/v1/session?code={code}")
    assert response is not None and response.ok
    assert page.url == f"{h.service.url}/"  # the code left the address bar
    await expect(page.get_by_test_id("app")).to_be_visible()
    await expect(page.get_by_test_id("live-status")).to_have_attribute("data-live", "yes")


def job_row(page: Page, job_id: str) -> Locator:
    return page.locator(f'[data-testid=job-row][data-job-id="{job_id}"]')


def task_row(page: Page, task_id: str) -> Locator:
    return page.locator(f'[data-testid=task-row][data-task-id="{task_id}"]')


async def keep_screenshot(page: Page, name: str) -> Path:
    SCREENSHOTS_DIR.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS_DIR / f"{name}.png"
    await page.screenshot(path=str(path), full_page=True)
    return path
