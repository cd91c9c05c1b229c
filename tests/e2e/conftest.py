"""One Chromium per test module for the dashboard tests, a fresh context per test."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from playwright.async_api import Browser as PlaywrightBrowser
from playwright.async_api import ConsoleMessage, async_playwright

from dispatcher.settings import find_browser
from tests.e2e.dashboard_browser import SCREENSHOTS_DIR, Browser


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def chromium_browser() -> AsyncIterator[PlaywrightBrowser]:
    executable = find_browser()
    if executable is None:
        pytest.skip("no Chromium on this machine (tests never download one)")
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=executable,
            headless=True,
            args=["--no-sandbox", "--disable-gpu", "--headless"],
        )
        try:
            yield browser
        finally:
            await browser.close()


@pytest_asyncio.fixture(loop_scope="module")
async def browser(chromium_browser: PlaywrightBrowser) -> AsyncIterator[Browser]:
    context = await chromium_browser.new_context(viewport={"width": 1400, "height": 900})
    try:
        page = await context.new_page()
        seen = Browser(page)

        def on_console(message: ConsoleMessage) -> None:
            # Refusals (401/403) are what some tests provoke; anything else is a bug.
            refused = "Failed to load resource" in message.text and (
                "401" in message.text or "403" in message.text
            )
            if message.type == "error" and not refused:
                seen.problems.append(f"{message.text} at {message.location.get('url')}")

        page.on("console", on_console)
        page.on("pageerror", lambda exc: seen.problems.append(str(exc)))
        yield seen
    finally:
        await context.close()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if SCREENSHOTS_DIR.is_dir() and any(SCREENSHOTS_DIR.glob("*.png")):
        terminalreporter.write_line(f"dashboard screenshots for review: {SCREENSHOTS_DIR}")
