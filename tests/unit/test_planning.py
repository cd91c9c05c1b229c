"""`planning.plan_batch`: the cost, the makespan and its named lower bound, and
what stops a batch, decided from what the caller read (issue 30)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dispatcher.tasks.makespan import LaneSlots
from dispatcher.tasks.planning import AllowanceLeft, BudgetLeft, ModelLoad, plan_batch


def test_models_on_separate_lanes_run_side_by_side_and_the_slowest_sets_the_makespan() -> None:
    chat = ModelLoad(
        "chat",
        tasks=10,
        duplicates=1,
        twins=1,
        cached=2,
        cost_usd=0.06,
        run_s=10.0,
        owners=("demo",),
        capacity=3,
    )
    video = ModelLoad("video", tasks=4, cost_usd=4.0, run_s=60.0, owners=("acme",), capacity=2)
    plan = plan_batch([chat, video], {}, now=0.0).to_json()
    rows = {row["model"]: row for row in plan["models"]}
    assert rows["chat"]["to_run"] == 6
    assert rows["chat"]["estimate_s"] == 20.0  # 6 tasks over 3 slots: 2 waves of 10 s
    assert rows["video"]["estimate_s"] == 120.0
    total = plan["total"]
    assert total["makespan_s"] == 120.0 and total["lower_bound_s"] == 120.0
    assert total["bound"] == "video: lane capacity: 4 tasks x 60.0 s over 2 slots"
    assert total["cost_usd"] == pytest.approx(4.06)
    assert total["deduplicated"] == 2 and total["cached"] == 2
    assert plan["ok"] and plan["stops"] == []


def test_models_sharing_a_provider_share_its_slots_and_waiting_work_counts() -> None:
    a = ModelLoad("a", tasks=3, run_s=10.0, owners=("demo",), capacity=3, queued_ahead=3)
    b = ModelLoad("b", tasks=3, run_s=10.0, owners=("demo",), capacity=3)
    plan = plan_batch([a, b], {}, now=0.0).to_json()
    # 9 tasks through the provider's 3 slots: 3 waves, not 2 side by side.
    assert plan["total"]["makespan_s"] == 30.0


def test_a_single_long_run_is_named_as_the_bound_and_unknown_history_says_so() -> None:
    one = ModelLoad("slow", tasks=1, run_s=300.0, owners=("x",), capacity=5)
    assert plan_batch([one], {}, now=0.0).total["bound"] == "slow: longest single run: 300.0 s"
    new = ModelLoad("new", tasks=2, owners=("y",), capacity=1)
    plan = plan_batch([one, new], {}, now=0.0, deadline=1000.0)
    assert plan.total["makespan_s"] is None
    assert plan.total["bound"] == "no run history: new"
    assert plan.refusals == ["cannot promise the deadline: no run history: new"]


def test_limits_refuse_a_batch_and_a_budget_says_when_it_stops_it() -> None:
    video = ModelLoad("video", tasks=10, cost_usd=10.0, run_s=60.0, owners=("acme",), capacity=2)
    budgets = {"acme": BudgetLeft("acme", 50.0, 46.0)}
    plan = plan_batch([video], budgets, now=1000.0, max_cost_usd=5.0, deadline=1200.0)
    assert plan.stops == [
        "budget acme/day: $46.00 of $50.00 spent; $4.00 left covers about 4 of 10 tasks "
        "($10.00 wanted), about 120 s in"
    ]
    assert plan.refusals[0] == "estimated cost $10.00 is over --max-cost $5.00"
    assert plan.refusals[1] == "estimated makespan 300 s ends 100 s after the deadline"
    assert plan.refusals[2].startswith("stopped by a budget: budget acme/day")
    assert not plan.to_json()["ok"]
    fine = plan_batch([video], {"acme": BudgetLeft("acme", 50.0, 0.0)}, now=0.0, max_cost_usd=10)
    assert fine.to_json()["ok"]


def test_a_budget_pays_for_the_cheapest_tasks_first() -> None:
    chat = ModelLoad("chat", tasks=3, cost_usd=0.03, run_s=1.0, owners=("demo",), capacity=3)
    video = ModelLoad("video", tasks=4, cost_usd=0.88, run_s=9.0, owners=("demo",), capacity=3)
    plan = plan_batch([video, chat], {"demo": BudgetLeft("demo", 0.10, 0.0)}, now=0.0)
    assert plan.stops[0].startswith(
        "budget demo/day: $0.00 of $0.10 spent; $0.10 left covers about 3 of 7 tasks"
    )


def test_a_long_task_holds_one_slot_while_the_others_go_on() -> None:
    """Two 60 s videos and six 10 s chats on a provider with 3 slots: the chats
    run through the third slot beside the videos (60 s, the lower bound), not
    three waves of the average task (67.5 s, the old estimate)."""
    video = ModelLoad("video", tasks=2, run_s=60.0, owners=("demo",), capacity=3)
    chat = ModelLoad("chat", tasks=6, run_s=10.0, owners=("demo",), capacity=3)
    plan = plan_batch([video, chat], {}, now=0.0).to_json()
    assert plan["total"]["makespan_s"] == 60.0 == plan["total"]["lower_bound_s"]


def test_the_batch_order_and_the_lanes_given_make_the_schedule() -> None:
    # The demo's web accounts: demo-1 serves chat and reasoner, demo-2 chat only.
    chat = ModelLoad("chat", tasks=3, run_s=4.0, owners=("demo-1", "demo-2"), capacity=2)
    chat = replace(chat, queue="web:chat")
    reasoner = ModelLoad("reasoner", tasks=1, run_s=2.0, owners=("demo-1",), capacity=1)
    reasoner = replace(reasoner, queue="web:reasoner")
    lanes = [
        LaneSlots("web:demo-1", 1, frozenset({"web:chat", "web:reasoner"})),
        LaneSlots("web:demo-2", 1, frozenset({"web:chat"})),
    ]
    order = ["chat", "chat", "chat", "reasoner"]
    plan = plan_batch([chat, reasoner], {}, now=0.0, lanes=lanes, order=order).to_json()
    rows = {row["model"]: row for row in plan["models"]}
    assert rows["chat"]["estimate_s"] == 8.0 and rows["reasoner"]["estimate_s"] == 6.0
    assert plan["total"]["makespan_s"] == 8.0


def test_an_estimate_from_the_profile_says_so() -> None:
    new = ModelLoad("new", tasks=4, run_s=3.0, run_from="profile", owners=("y",), capacity=1)
    plan = plan_batch([new], {}, now=0.0)
    assert plan.total["makespan_s"] == 12.0
    assert plan.total["bound"] == (
        "new: lane capacity: 4 tasks x 3.0 s over 1 slots (from expected_run_s: no run history yet)"
    )
    assert plan.models[0]["run_from"] == "profile"


def test_web_accounts_allowances_say_which_stops_the_batch_and_until_when() -> None:
    chat = ModelLoad(
        "chat", tasks=10, run_s=60.0, owners=("demo-1", "demo-2"), capacity=2, queued_ahead=2
    )
    left = {
        "demo-1": AllowanceLeft("demo-1", 5, 1, 86_400.0, "00:00 UTC"),
        "demo-2": AllowanceLeft("demo-2", 5, 3, 86_400.0, "00:00 UTC"),
    }
    plan = plan_batch([chat], {}, now=0.0, allowances=left).to_json()
    assert plan["models"][0]["per_day"] == 10
    # 6 left today: the 2 queued ahead, then 4 of the batch's 10.
    assert plan["stops"] == [
        "allowance chat/day (demo-1 1 of 5, demo-2 3 of 5 used): 6 left cover 4 of 10 tasks "
        "after 2 queued, about 180 s in; the rest waits until 00:00 UTC"
    ]
    assert plan["ok"]  # the rest runs after the reset: no limit asked for, none unmet
    late = plan_batch([chat], {}, now=0.0, allowances=left, deadline=3600.0).to_json()
    assert late["refusals"] == [f"the rest waits past the deadline: {plan['stops'][0]}"]
    # Enough left, or an account without an allowance to take the rest: no stop.
    roomy = {**left, "demo-2": AllowanceLeft("demo-2", 50, 0, 86_400.0, "00:00 UTC")}
    assert plan_batch([chat], {}, now=0.0, allowances=roomy).stops == []
    one = {"demo-1": left["demo-1"]}
    unlimited = plan_batch([chat], {}, now=0.0, allowances=one).to_json()
    assert unlimited["stops"] == [] and unlimited["models"][0]["per_day"] is None
