"""The plan's run time follows a task's param (`run_s_param`): each task its
own expected time in the simulated schedule, the rest as before."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatcher.errors import ConfigError
from dispatcher.profiles import parse_profile
from dispatcher.tasks.makespan import LaneSlots
from dispatcher.tasks.planning import ModelLoad, param_run_s, plan_batch

PROFILE = """
name = "m"
kind = "api"
provider = "demo"
{keys}

[api]
base_url = "http://10.0.0.1:8188"
style = "comfyui"
workflow = "wf.json"
inputs = {{ prompt = "6.inputs.text" }}
"""
WORKFLOW = '{"6": {"class_type": "CLIPTextEncode", "inputs": {"text": ""}}}'


def test_a_param_sets_the_run_time_at_the_time_scale() -> None:
    assert param_run_s({"gen_s": 4}, "gen_s", 1.5, 0.1) == pytest.approx(0.6)
    assert param_run_s({"gen_s": "2"}, "gen_s", 1.0, 1.0) == 2.0
    assert param_run_s({"prompt": "x"}, "gen_s", 1.0, 1.0) is None
    assert param_run_s({"gen_s": True}, "gen_s", 1.0, 1.0) is None
    assert param_run_s({"gen_s": "soon"}, "gen_s", 1.0, 1.0) is None
    assert param_run_s({"gen_s": 3}, None, None, 1.0) is None


def test_one_slot_runs_each_task_for_its_own_time_and_the_plan_says_so() -> None:
    video = ModelLoad(
        "video",
        tasks=3,
        run_s=None,
        run_from="profile",
        task_run_s=(10.0, 50.0, 30.0),
        owners=("acme",),
        capacity=1,
    )
    plan = plan_batch([video], {}, now=0.0).to_json()
    assert plan["total"]["makespan_s"] == 90.0  # not 3 x a mean or a typical run
    assert plan["total"]["lower_bound_s"] == 90.0
    assert plan["models"][0]["run_from"] == "param"
    assert "each task's run time from its param: video" in plan["total"]["bound"]


def test_tasks_without_the_param_fall_back_to_the_models_run_time() -> None:
    video = ModelLoad(
        "video",
        tasks=3,
        run_s=20.0,
        run_from="profile",
        task_run_s=(5.0, None, 5.0),
        owners=("acme",),
        capacity=1,
    )
    plan = plan_batch([video], {}, now=0.0).to_json()
    assert plan["total"]["makespan_s"] == 30.0
    plain = plan_batch([video.__class__("video", tasks=3, run_s=20.0, capacity=1)], {}, now=0.0)
    assert plain.total["makespan_s"] == 60.0
    assert plain.models[0]["run_from"] == "history"


def test_a_model_without_history_or_param_on_every_task_stays_unknown() -> None:
    video = ModelLoad("video", tasks=2, run_s=None, task_run_s=(), capacity=1)
    assert plan_batch([video], {}, now=0.0).total["makespan_s"] is None


@settings(max_examples=150, deadline=None)
@given(
    times=st.lists(st.floats(min_value=0.0, max_value=1_000.0), min_size=1, max_size=30),
    slots=st.integers(min_value=1, max_value=5),
)
def test_per_task_makespan_is_at_least_the_bound_and_the_sum_on_one_slot(
    times: list[float], slots: int
) -> None:
    load = ModelLoad("m", tasks=len(times), task_run_s=tuple(times), capacity=slots)
    lanes = [LaneSlots("lane", slots, frozenset({"model:m"}))]
    total = plan_batch([load], {}, now=0.0, lanes=lanes).total
    assert total["makespan_s"] >= total["lower_bound_s"] - 1e-3
    assert total["lower_bound_s"] >= max(times) - 1e-3
    assert total["makespan_s"] <= total["lower_bound_s"] + max(times) + 1e-3  # Graham
    if slots == 1:
        assert total["makespan_s"] == pytest.approx(sum(times), abs=1e-2)


@pytest.mark.parametrize(
    ("keys", "named"),
    [
        ('run_s_param = "gen_s"', "run_s_per_unit"),
        ("run_s_per_unit = 1", "run_s_param"),
        ('run_s_param = "gen_s"\nrun_s_per_unit = 0', "run_s_per_unit"),
    ],
)
def test_a_half_or_bad_run_time_param_is_refused_naming_the_key(
    tmp_path: Path, keys: str, named: str
) -> None:
    (tmp_path / "wf.json").write_text(WORKFLOW)
    path = tmp_path / "m.toml"
    path.write_text(PROFILE.format(keys=keys))
    with pytest.raises(ConfigError, match=named):
        parse_profile(path)


def test_the_run_time_param_loads(tmp_path: Path) -> None:
    (tmp_path / "wf.json").write_text(WORKFLOW)
    path = tmp_path / "m.toml"
    path.write_text(PROFILE.format(keys='run_s_param = "gen_s"\nrun_s_per_unit = 2.5'))
    profile = parse_profile(path)
    assert profile is not None
    assert (profile.run_s_param, profile.run_s_per_unit) == ("gen_s", 2.5)
