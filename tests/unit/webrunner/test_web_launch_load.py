"""A page a browser was told to open at launch: how long its load is waited for."""

from __future__ import annotations

from typing import cast

from playwright.async_api import Page
from playwright.async_api import TimeoutError as PlaywrightTimeoutError

from dispatcher.clock import FakeClock
from dispatcher.profiles import WebSpec
from webrunner.page import started_on
from webrunner.pagestep import Budget
from webrunner.prewarm import PrestartContext

URL = "http://127.0.0.1:9/chat"
SPEC = WebSpec.model_validate(
    {"url": URL, "logged_in": "#composer", "input": "textarea", "submit": "#send", "answer": ".a"}
)


class LaunchedPage:
    """A first tab whose load Playwright reports as seen, or never (it may
    miss the events of a load begun before it connected)."""

    def __init__(self, *, seen: bool) -> None:
        self.url = URL
        self.seen = seen
        self.timeouts_ms: list[float] = []

    async def wait_for_load_state(self, state: str, **options: float) -> None:
        self.timeouts_ms.append(options["timeout"])
        if not self.seen:
            raise PlaywrightTimeoutError(f"Timeout {options['timeout']:.0f}ms exceeded.")


async def launched_on(page: LaunchedPage, start_url: str, budget: Budget, clock: FakeClock) -> bool:
    """`started_on` for the page of a browser told to open `start_url`."""
    ctx = PrestartContext("demo-1", clock)
    return await started_on(ctx, cast(Page, page), start_url, SPEC, budget)


async def test_a_load_never_seen_costs_a_third_of_the_budget_and_the_caller_loads_it() -> None:
    clock = FakeClock()
    page = LaunchedPage(seen=False)
    # Not loaded: the caller loads the page itself, with the two thirds left
    # (before, the whole minute went on this wait and the start failed).
    assert await launched_on(page, URL, Budget.after(clock, 60.0, "60 s"), clock) is False
    assert page.timeouts_ms == [20_000.0]


async def test_a_load_seen_is_the_model_s_page_loaded() -> None:
    clock = FakeClock()
    page = LaunchedPage(seen=True)
    budget = Budget.after(clock, 60.0, "60 s")
    assert await launched_on(page, URL, budget, clock) is True
    # Told to open another page at launch: nothing to wait for.
    assert await launched_on(page, "about:blank", budget, clock) is False
    assert len(page.timeouts_ms) == 1
