"""Fallback tasks (issue 30): which queues a lane's claim leaves to the free
lanes still to fill in a round, and why passed-over models were skipped."""

from __future__ import annotations

from dispatcher.accounts.health import AccountState, StateView
from dispatcher.models import Kind, Skipped, Task
from dispatcher.scheduling.fallbacks import (
    LaneWhy,
    lane_why,
    passed_over,
    preferred_queues,
    skipped,
)
from dispatcher.scheduling.lanes import LaneSpec

OK = StateView(AccountState.OK, None, None)


def _lane(name: str, *queues: str, concurrency: int = 1) -> LaneSpec:
    kind = Kind.WEB if name.startswith("web:") else Kind.API
    models = tuple(q.split(":", 1)[1] for q in queues)
    return LaneSpec(name, kind, name.split(":", 1)[1], queues, models, concurrency)


def _task(queue: str, *alts: str) -> Task:
    return Task(
        id="t",
        model=queue.split(":", 1)[1],
        kind=Kind.API,
        queue=queue,
        params={},
        fingerprint="f",
        created_at=0.0,
        alt_queues=alts,
    )


def test_a_lane_defers_to_the_free_lanes_still_to_fill_only() -> None:
    web = _lane("web:demo-1", "web:chat")
    api = _lane("api:demo", "api-model:chat-api", "api-model:video")
    queue = _lane("api:demo-queue", "api-model:queue")
    free = {"api:demo": True, "api:demo-queue": False}
    prefer = preferred_queues(web, [api, queue], lambda lane: free[lane.name])
    assert prefer == ("api-model:chat-api", "api-model:video")
    # The last lane of a round has nobody left to defer to.
    assert preferred_queues(queue, [], lambda lane: True) == ()
    # Its own queues are never deferred to (another account of the same model).
    twin = _lane("web:demo-2", "web:chat")
    assert preferred_queues(web, [twin], lambda lane: True) == ()


def test_the_models_listed_before_the_one_that_ran_are_skipped_with_their_reasons() -> None:
    task = _task("api-model:a", "api-model:b", "web:c")
    assert passed_over(task, "web:c") == ["api-model:a", "api-model:b"]
    assert passed_over(task, "api-model:b") == ["api-model:a"]
    assert passed_over(task, "api-model:a") == []
    why = {
        "api-model:a": [
            LaneWhy("api:acme", "budget acme/day: $50.00 of $50.00 spent"),
        ],
        "api-model:b": [LaneWhy("api:b1", "api:b1 was busy"), LaneWhy("api:b2", None)],
    }
    assert skipped(task, "web:c", lambda queue: why.get(queue, [])) == (
        Skipped("a", "budget acme/day: $50.00 of $50.00 spent"),
        Skipped("b", "api:b1 was busy; api:b2 did not take it first"),
    )
    assert skipped(task, "api-model:b", lambda queue: []) == (
        Skipped("a", "no lane on this host serves it"),
    )


def test_a_lane_says_what_held_it_first_state_then_allowance_then_budget_then_busy() -> None:
    web = _lane("web:demo-1", "web:chat")

    def why(view: StateView, allowance: str | None = None, running: int = 0) -> str | None:
        found = lane_why(
            web, view, allowance=allowance, budget=None, running=running, concurrency=1
        )
        return found.why

    attention = StateView(AccountState.NEEDS_ATTENTION, None, "logged out")
    assert why(attention, "allowance used") == "web:demo-1 needs attention (logged out)"
    assert why(StateView(AccountState.DISABLED, None, None)) == "web:demo-1 is disabled"
    cooling = StateView(AccountState.COOLDOWN, 3600.0, "usage limit")
    assert why(cooling) == "web:demo-1 is cooling down until 01:00:00 UTC (usage limit)"
    used = "allowance used, 2 of 2, until 00:00 UTC"
    assert why(OK, used, running=1) == f"web:demo-1: {used}"
    assert why(OK, running=1) == "web:demo-1 was busy"
    assert why(OK) is None
    api = _lane("api:acme", "api-model:a", concurrency=3)
    budget = "budget acme/day: $50.00 of $50.00 spent"
    found = lane_why(api, OK, allowance=None, budget=budget, running=0, concurrency=3)
    assert found.why == budget
