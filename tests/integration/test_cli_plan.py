"""`dispatcher plan` and `dispatcher batch --max-cost --deadline` as a user runs
them (issue 30): real CLI processes against a real service with a budget."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.helpers import REPO
from tests.support.servicecli import ServiceProcess, start_service

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    root = tmp_path_factory.mktemp("plan")
    proc = start_service(root, env={"DISPATCHER_BUDGETS": "demo=0.05"})
    try:
        # Two runs give the chat model a run history to plan with.
        with proc.http() as client:
            ids = [
                client.post(
                    "/v1/tasks",
                    json={"model": "demo-chat-api", "params": {"prompt": f"warm {i}", "gen_s": 1}},
                ).json()["id"]
                for i in range(2)
            ]
            deadline = time.monotonic() + 60
            while any(client.get(f"/v1/tasks/{i}").json()["state"] != "success" for i in ids):
                assert time.monotonic() < deadline, "the warm-up tasks never finished"
                time.sleep(0.05)
            # The plans below count "warm 0" as cached, not as a twin: wait
            # for its de-dup window to pass (0.6 s at the tests' time scale;
            # a busy machine plans within it).
            warm = {"model": "demo-chat-api", "params": {"prompt": "warm 0", "gen_s": 1}}
            while client.post("/v1/plan", json={"tasks": [warm]}).json()["total"]["cached"] != 1:
                assert time.monotonic() < deadline, "warm 0 never counted as cached"
                time.sleep(0.05)
        yield proc
    finally:
        assert proc.stop() == 0, proc.log()[-3000:]


def _batch(tmp_path: Path, prompts: list[str]) -> Path:
    path = tmp_path / "batch.jsonl"
    lines = [json.dumps({"model": "demo-chat-api", "prompt": p, "gen_s": 1}) for p in prompts]
    path.write_text("\n".join(lines) + "\n")
    return path


def _jobs(service: ServiceProcess) -> int:
    with service.http() as client:
        return len(client.get("/v1/jobs").json()["items"])


def test_plan_prints_cost_and_makespan_without_submitting(
    service: ServiceProcess, tmp_path: Path
) -> None:
    # "warm 0" ran already (its result is cached); "a" twice runs once.
    batch = _batch(tmp_path, ["a", "a", "b", "c", "warm 0"])
    before = _jobs(service)
    done = service.cli("plan", str(batch))
    assert done.returncode == 0, done.stderr
    assert "$0.03" in done.stdout and "lower bound" in done.stdout
    assert "set by demo-chat-api: " in done.stdout
    answer = json.loads(service.cli("plan", str(batch), "--json").stdout)
    total = answer["total"]
    assert total["tasks"] == 5 and total["to_run"] == 3
    assert total["deduplicated"] == 1 and total["cached"] == 1
    assert total["cost_usd"] == 0.03 and total["makespan_s"] > 0
    assert answer["stops"] == [] and answer["ok"]
    assert _jobs(service) == before  # nothing was submitted


def test_a_batch_over_its_limits_is_refused_with_the_reason_unless_told(
    service: ServiceProcess, tmp_path: Path
) -> None:
    batch = _batch(tmp_path, [f"limit {i}" for i in range(8)])
    before = _jobs(service)
    refused = service.cli("batch", str(batch), "--max-cost", "0.05", "--deadline", "2000-01-01")
    assert refused.returncode == 1
    assert "batch refused, nothing submitted: estimated cost $0.08 is over --max-cost $0.05" in (
        refused.stderr
    )
    assert "after the deadline" in refused.stderr
    # The provider's budget ($0.05 a day, $0.02 spent) would stop it too, and says when.
    assert "stopped by a budget: budget demo/day: $0.02 of $0.05 spent" in refused.stderr
    assert _jobs(service) == before
    bad = service.cli("batch", str(batch), "--deadline", "tomorrow-ish")
    assert bad.returncode == 2 and "--deadline 'tomorrow-ish' is neither HH:MM" in bad.stderr
    taken = service.cli("batch", str(batch), "--max-cost", "0.05", "--ignore-limits", "--detach")
    assert taken.returncode == 0, taken.stderr
    assert _jobs(service) == before + 1


def _sample(tmp_path: Path, *, gen_s: bool) -> Path:
    """The sample batch's API models, never run here (with or without their
    tasks' `gen_s`, the param their profiles' run time follows)."""
    path = tmp_path / "first.jsonl"
    sample = REPO / "demo" / "sample-batch.jsonl"
    lines = []
    for line in sample.read_text().splitlines():
        if '"demo-video"' in line or '"demo-queue"' in line:
            task = json.loads(line)
            if not gen_s:
                task["params"].pop("gen_s")
            lines.append(json.dumps(task))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_model_without_history_is_planned_from_its_profiles_expected_run(
    service: ServiceProcess, tmp_path: Path
) -> None:
    """Tasks without `gen_s`: their profiles' `expected_run_s` (demo-video 5 s,
    demo-queue 3 s) at the time scale 0.02."""
    path = _sample(tmp_path, gen_s=False)
    answer = json.loads(service.cli("plan", str(path), "--json").stdout)
    total = answer["total"]
    # Four 0.1 s videos through the provider's three slots: 0.2 s.
    assert total["makespan_s"] == 0.2 and total["cost_usd"] > 0
    assert total["bound"].endswith("(from expected_run_s: no run history yet)")
    # (The fixture's $0.05 budget, spent by now, would stop it: exit 1, said.)
    shown = service.cli("plan", str(path))
    said = " ".join(shown.stdout.split())
    assert "makespan ~0s, lower bound 0s set by demo-video:" in said
    assert "(from expected_run_s: no run history yet)" in said


def test_a_task_with_its_run_time_param_is_planned_for_its_own_time(
    service: ServiceProcess, tmp_path: Path
) -> None:
    """The profiles say `run_s_param = "gen_s"`: each video its own gen_s
    (3, 3, 3, 4 nominal s at 0.02), not the profile's typical 5 s."""
    answer = json.loads(service.cli("plan", str(_sample(tmp_path, gen_s=True)), "--json").stdout)
    total = answer["total"]
    # Three 0.06 s videos side by side on the three slots, then the 0.08 s one.
    assert total["makespan_s"] == 0.14
    assert "each task's run time from its param: demo-video" in total["bound"]
    rows = {row["model"]: row for row in answer["models"]}
    assert rows["demo-video"]["run_from"] == "param"
    assert rows["demo-queue"]["run_from"] == "param"
