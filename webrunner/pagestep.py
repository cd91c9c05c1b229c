"""One call into a page: through the run's guard, within the phase's budget.

Owns what every page call goes through (`page_step`), i.e. the run's one guard
(`RunContext.guard`): a cancel ends it at once, the phase's deadline
(`Budget`) bounds it, Playwright errors are translated, and the run beats only
once the call has returned. A renderer stuck in a `while (true) {}` never
answers, so the beats stop and the core's stale rule takes over, while cancel
and the deadline still work. `PageContext` is what a page call needs from
whoever drives the page.
"""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from playwright.async_api import Error as PlaywrightError
from playwright.async_api import TimeoutError as PlaywrightTimeoutError

from dispatcher.clock import Clock
from dispatcher.errors import TransientError
from dispatcher.models import Stage

T = TypeVar("T")


class PageContext(Protocol):
    """What driving a page needs from whoever drives it: a task's
    `RunContext`, or a browser started before any task (`prewarm.py`)."""

    clock: Clock
    owner: str  # the web account whose lane drives the page

    def check_canceled(self) -> None: ...

    def beat(self) -> None: ...

    async def set_stage(
        self, stage: Stage, progress: float | None = None, queue_position: int | None = None
    ) -> None: ...

    async def guard(
        self,
        work: Awaitable[T],
        budget_s: float | None = None,
        *,
        what: str = "waiting",
        budget_label: str | None = None,
        alive: bool = False,
    ) -> T: ...


@dataclass(frozen=True)
class Budget:
    """A deadline on the task's clock, and how a timeout message names it."""

    deadline: float
    label: str  # e.g. "the profile's timeout_s (600 s)"

    @classmethod
    def after(cls, clock: Clock, real_s: float, label: str) -> Budget:
        return cls(clock.monotonic() + real_s, label)

    def remaining(self, clock: Clock) -> float:
        return self.deadline - clock.monotonic()

    def exceeded(self, what: str) -> TransientError:
        return TransientError(f"timed out after {self.label} while {what}", kind="timeout")


def first_line(exc: BaseException) -> str:
    text = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    return str(text).strip().splitlines()[0][:300]


async def page_step(
    ctx: PageContext,
    aw: Awaitable[T],
    *,
    what: str,
    budget: Budget,
    alive: bool = False,
) -> T:
    """Await one step through the run's guard, within the phase's budget, with
    Playwright's errors translated; see `RunContext.guard` for cancel, the
    budget and beats (`alive`: the wait itself proves liveness)."""
    try:
        return await ctx.guard(
            aw, budget.remaining(ctx.clock), what=what, budget_label=budget.label, alive=alive
        )
    except PlaywrightTimeoutError as exc:
        raise TransientError(f"{what}: {first_line(exc)}", kind="timeout") from exc
    except PlaywrightError as exc:
        raise TransientError(f"{what}: {first_line(exc)}", kind="browser") from exc


def navigated(exc: TransientError) -> bool:
    """Whether a page call failed because the page navigated under it."""
    return exc.kind == "browser" and navigation_error(str(exc))


def navigation_error(text: str) -> bool:
    """Whether a Playwright error's text says the page navigated under the call."""
    return "Execution context was destroyed" in text or "navigation" in text.lower()
