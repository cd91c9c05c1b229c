"""The browser memory budget's decision (`webrunner.memory.plan_room`): which
idle browsers close for a start, least recently used first, never a busy one."""

from __future__ import annotations

from webrunner.memory import (
    DEFAULT_BROWSER_BYTES,
    MB,
    OpenBrowser,
    Room,
    new_browser_bytes,
    plan_room,
)


def browser(account: str, mb: int, *, busy: bool = False, idle_since: float = 0.0) -> OpenBrowser:
    return OpenBrowser(account, mb * MB, busy, idle_since)


def plan(
    browsers: list[OpenBrowser], *, budget_mb: int, new_mb: int = 250, service_mb: int = 100
) -> Room:
    return plan_room(
        browsers,
        service_bytes=service_mb * MB,
        starting_bytes=0,
        new_bytes=new_mb * MB,
        budget_bytes=budget_mb * MB,
    )


def test_a_start_within_the_budget_closes_nothing() -> None:
    room = plan([browser("a", 250), browser("b", 250)], budget_mb=1000)
    assert room == Room(start=True, close=(), counted_bytes=850 * MB)


def test_over_the_budget_the_least_recently_used_idle_browser_closes_first() -> None:
    browsers = [
        browser("recent", 250, idle_since=30.0),
        browser("oldest", 250, idle_since=10.0),
        browser("middle", 250, idle_since=20.0),
    ]
    # 100 + 3 x 250 + 250 = 1100: one browser must go, the one idle longest.
    room = plan(browsers, budget_mb=900)
    assert room.start and room.close == ("oldest",)
    # Two must go: the two idle longest, oldest first.
    room = plan(browsers, budget_mb=650)
    assert room.start and room.close == ("oldest", "middle")


def test_a_busy_browser_is_never_closed_even_when_it_was_used_least_recently() -> None:
    browsers = [
        browser("running", 250, busy=True, idle_since=1.0),
        browser("idle", 250, idle_since=50.0),
    ]
    room = plan(browsers, budget_mb=650)
    assert room.start and room.close == ("idle",)


def test_when_only_running_browsers_could_make_room_it_waits_and_closes_nothing() -> None:
    browsers = [
        browser("running", 250, busy=True),
        browser("idle", 250, idle_since=5.0),
    ]
    # Even with the idle one closed, 100 + 250 + 250 = 600 > 500: closing
    # it would cost its account a start and let this one start no sooner.
    room = plan(browsers, budget_mb=500)
    assert not room.start and room.close == ()
    assert room.counted_bytes == 850 * MB


def test_other_starts_in_flight_count_against_the_budget() -> None:
    room = plan_room(
        [],
        service_bytes=100 * MB,
        starting_bytes=250 * MB,
        new_bytes=250 * MB,
        budget_bytes=500 * MB,
    )
    assert not room.start


def test_a_budget_below_one_browser_lets_one_browser_run_at_a_time() -> None:
    # Nothing busy or starting: every idle browser closes, then it starts alone.
    room = plan(
        [browser("a", 250, idle_since=2.0), browser("b", 250, idle_since=1.0)], budget_mb=200
    )
    assert room.start and room.alone and room.close == ("b", "a")
    # With one running, it waits instead.
    room = plan([browser("a", 250, busy=True)], budget_mb=200)
    assert not room.start
    # With none open at all, it starts.
    assert plan([], budget_mb=200).start


def test_the_new_browser_is_taken_at_the_largest_open_one_else_the_largest_seen() -> None:
    assert new_browser_bytes([200 * MB, 260 * MB], 0) == 260 * MB
    assert new_browser_bytes([], 240 * MB) == 240 * MB
    assert new_browser_bytes([], 0) == DEFAULT_BROWSER_BYTES
