"""The browser memory budget's decision: may a browser start now, and which
idle browsers must close first. Pure: the numbers come from `memorygate.py`.

What counts against the budget (`browser_memory_mb`) is everything the
service holds on the host: its own processes (Python, the Playwright driver)
and every account's Chromium, each a tree of processes, measured as PSS
(shared pages split between the processes that map them, so the sum over
trees is what the host really spends; RSS would count Chromium's shared
binary once per process, four to six times over).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

MB = 1024**2
# What a browser is taken to need before any has been measured on this host
# (a Chromium on the demo model's page: 160-240 MB of PSS).
DEFAULT_BROWSER_BYTES = 300 * MB


@dataclass(frozen=True)
class OpenBrowser:
    """An account's open browser as the budget sees it."""

    account: str
    bytes: int  # its process tree's PSS (or what a young browser is taken to need)
    busy: bool  # a task (or a start, or an operator) holds its account
    idle_since: float  # monotonic; when it was last handed back (least recently used first)


@dataclass(frozen=True)
class Room:
    """The decision for one browser start."""

    start: bool  # it may start (once `close` are closed)
    close: tuple[str, ...] = ()  # idle browsers to close first, least recently used first
    # Bytes counted against the budget with the start (after the closes).
    counted_bytes: int = 0
    # True when the budget is below one browser: it starts because nothing else is open.
    alone: bool = False


def plan_room(
    browsers: Sequence[OpenBrowser],
    *,
    service_bytes: int,
    starting_bytes: int,
    new_bytes: int,
    budget_bytes: int,
) -> Room:
    """May a browser of `new_bytes` start, with `browsers` open, other starts
    holding `starting_bytes` and the service `service_bytes`?

    Within the budget: yes. Over it: the idle browsers close, least recently
    used first, until it fits. When closing every idle one would not make it
    fit, nothing is closed and the start waits (for a running task to end,
    whose browser then becomes idle): closing them would cost their accounts
    a start and let this one start no sooner. A busy browser is never closed.
    When nothing else is open or starting, the start goes ahead whatever the
    budget (below one browser: one browser at a time), after the idle ones
    have closed.
    """
    full = service_bytes + starting_bytes + new_bytes + sum(b.bytes for b in browsers)
    if full <= budget_bytes:
        return Room(start=True, counted_bytes=full)
    total = full
    idle = sorted((b for b in browsers if not b.busy), key=lambda b: (b.idle_since, b.account))
    close: list[str] = []
    for browser in idle:
        if total <= budget_bytes:
            break
        close.append(browser.account)
        total -= browser.bytes
    if total <= budget_bytes:
        return Room(start=True, close=tuple(close), counted_bytes=total)
    if starting_bytes == 0 and all(not b.busy for b in browsers):
        return Room(start=True, close=tuple(close), counted_bytes=total, alone=True)
    return Room(start=False, counted_bytes=full)


def new_browser_bytes(measured: Sequence[int], largest_seen: int) -> int:
    """What the next browser is taken to need: the largest open one's footprint,
    else the largest seen on this host, else `DEFAULT_BROWSER_BYTES`."""
    return max(measured, default=0) or largest_seen or DEFAULT_BROWSER_BYTES
