"""`makespan.simulate`: the batch through the lanes as the scheduler runs it
(issue 30), against hand-worked schedules and the bounds every schedule obeys."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from dispatcher.tasks.makespan import LaneSlots, PlannedRun, simulate

WEB = LaneSlots("web:acct-1", 1, frozenset({"web:chat"}))
API = LaneSlots("api:demo", 3, frozenset({"api-model:chat", "api-model:video"}))


def test_a_web_account_adds_its_tasks_up_beside_a_provider_working_three_at_a_time() -> None:
    runs = [
        PlannedRun("web:chat", 10.0),
        PlannedRun("api-model:video", 9.0),
        PlannedRun("api-model:chat", 1.0),
        PlannedRun("api-model:chat", 1.0),
        PlannedRun("web:chat", 5.0),
        PlannedRun("api-model:chat", 1.0),
        PlannedRun("api-model:video", 9.0),
    ]
    schedule = simulate(runs, [WEB, API])
    # Web: 10 + 5, one after the other. API: the two 1 s chats free their slots
    # at 1 s; the third chat takes one (1-2 s), the second video the other
    # (1-10 s) while the first video still runs (0-9 s): not two waves of 9 s.
    assert schedule.ends_s == {"web:chat": 15.0, "api-model:video": 10.0, "api-model:chat": 2.0}
    assert schedule.makespan_s == 15.0 and not schedule.unplaced


def test_an_account_serving_two_models_takes_the_other_when_a_serial_one_is_busy() -> None:
    # demo-chat on two accounts, demo-reasoner on the first only (the demo's
    # profiles): the third chat goes to the account that serves chat alone.
    both = LaneSlots("web:demo-1", 1, frozenset({"web:chat", "web:reasoner"}))
    chat_only = LaneSlots("web:demo-2", 1, frozenset({"web:chat"}))
    runs = [PlannedRun("web:chat", 4.0)] * 3 + [PlannedRun("web:reasoner", 2.0)]
    schedule = simulate(runs, [both, chat_only])
    assert schedule.ends_s == {"web:chat": 8.0, "web:reasoner": 6.0}


def test_a_queue_no_open_lane_serves_is_named() -> None:
    schedule = simulate([PlannedRun("web:gone", 3.0)], [API])
    assert schedule.unplaced == {"web:gone"} and schedule.makespan_s == 0.0


@settings(max_examples=200, deadline=None)
@given(
    durations=st.lists(st.floats(0.1, 100.0), min_size=1, max_size=60),
    slots=st.integers(1, 5),
)
def test_one_lane_is_within_the_longest_run_of_the_lower_bound(
    durations: list[float], slots: int
) -> None:
    lane = LaneSlots("api:p", slots, frozenset({"q"}))
    schedule = simulate([PlannedRun("q", d) for d in durations], [lane])
    work = sum(durations)
    lower = max(work / slots, max(durations))
    # No schedule beats the lower bound; list scheduling is within the
    # longest run of it (Graham), and never worse than running them in series.
    assert lower - 1e-6 <= schedule.makespan_s <= work / slots + max(durations) + 1e-6
    assert schedule.makespan_s <= work + 1e-6
    if slots == 1:
        assert math.isclose(schedule.makespan_s, work, rel_tol=1e-9)


@settings(max_examples=200, deadline=None)
@given(
    web=st.lists(st.floats(0.1, 50.0), max_size=20),
    api=st.lists(st.floats(0.1, 50.0), max_size=40),
)
def test_lanes_that_share_no_queue_never_wait_on_each_other(
    web: list[float], api: list[float]
) -> None:
    both = simulate(
        [PlannedRun("web:chat", d) for d in web] + [PlannedRun("api-model:chat", d) for d in api],
        [WEB, API],
    )
    alone_web = simulate([PlannedRun("web:chat", d) for d in web], [WEB])
    alone_api = simulate([PlannedRun("api-model:chat", d) for d in api], [API])
    assert both.makespan_s == max(alone_web.makespan_s, alone_api.makespan_s)
