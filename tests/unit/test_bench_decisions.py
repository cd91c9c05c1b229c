"""The benchmarks' own decisions: which target a run met, how a slow run
still measures memory growth. Pure functions of figures, no processes."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

import pytest

from bench.__main__ import HARNESS, build_summary
from bench.batch import batch_checks, batch_figures
from bench.common import (
    BenchResult,
    Check,
    cpu_shares,
    disk_calibration,
    median_run,
    noise,
    on_cpu_s,
    schedstat_s,
)
from bench.hosts import (
    ROUNDS,
    Footprint,
    RoundChoice,
    paired_ratio,
    quiet_rounds,
    steady_checks,
)
from bench.memory import (
    MIN_CYCLE_TASKS,
    PACE_MARGIN,
    WARM_CYCLES,
    another_cycle,
    cycle_size,
    growth_per_cycle,
)
from bench.mixed_peers import peer_checks


def _mixed(makespan: float, excess: float, collisions: int = 0, ok: bool = True) -> dict[str, Any]:
    return {
        "makespan_s": makespan,
        "makespan_over_lb": makespan / 90.0,
        "all_succeeded": ok,
        "api_excess_wait_mean_s": excess,
        "web_collisions": collisions,
        "failed": [] if ok else [{"index": 1, "kind": "web", "error": "x"}],
        "unfinished": 0,
    }


def test_ours_best_of_all_on_the_mixed_batch_meets_the_target() -> None:
    checks = peer_checks(
        _mixed(91.0, 0.003), {"celery": _mixed(95.0, 0.05), "dramatiq": _mixed(97.0, 1.2)}
    )
    assert checks[0].met is True
    assert [c.met for c in checks[1:]] == [None, None]  # each peer reported


@pytest.mark.parametrize(
    ("peer", "why"),
    [
        (_mixed(90.5, 0.05), "a peer finished sooner"),
        (_mixed(95.0, 0.001), "a peer's API tasks waited less"),
    ],
)
def test_a_peer_better_on_one_figure_misses_the_target(peer: dict[str, Any], why: str) -> None:
    assert peer_checks(_mixed(91.0, 0.003), {"celery": peer})[0].met is False, why


def test_collisions_or_a_peer_that_did_not_run_miss_the_target() -> None:
    assert peer_checks(_mixed(91.0, 0.0, collisions=1), {"celery": _mixed(99, 1)})[0].met is False
    not_run = peer_checks(_mixed(91.0, 0.0), {"celery": {"system": "celery", "error": "boom"}})
    assert not_run[0].met is False
    assert "did not run" in not_run[1].value


def test_a_peer_that_lost_tasks_is_beaten_whatever_its_makespan() -> None:
    checks = peer_checks(_mixed(91.0, 0.003), {"celery": _mixed(60.0, 0.5, ok=False)})
    assert checks[0].met is True


def test_no_peers_no_target() -> None:
    assert peer_checks(_mixed(91.0, 0.0), {}) == []


def _batch(rate: float, p99_ms: float, done: int = 2000) -> dict[str, Any]:
    return {
        "tasks_per_s": rate,
        "submit_to_done_p99_ms": p99_ms,
        "submit_to_done_p50_ms": p99_ms / 2,
        "succeeded": done,
        "batch_call_ms": 50.0,
        "cpu_ms_per_task": 1.0,
    }


def test_batch_target_compares_with_the_fastest_peer_and_its_p99() -> None:
    rows = {"dispatcher": _batch(700, 2900), "dramatiq": _batch(650, 3000), "arq": _batch(30, 9e3)}
    assert batch_checks(rows, 2000)[0].met is True
    rows["dramatiq"] = _batch(650, 2800)  # slower but a better p99
    assert batch_checks(rows, 2000)[0].met is False
    rows["dramatiq"] = _batch(750, 3000)
    assert batch_checks(rows, 2000)[0].met is False


def test_batch_target_compares_each_systems_median_round() -> None:
    # One slow round each (a VM's moment) decides nothing.
    ours = median_run([_batch(640, 3100), _batch(760, 2600), _batch(750, 2650)])
    dramatiq = median_run([_batch(757, 2610), _batch(700, 2800), _batch(720, 2700)])
    check = batch_checks({"dispatcher": ours, "dramatiq": dramatiq}, 2000)[0]
    assert check.met is True
    assert check.value.startswith("ours 750/s (rounds 640-760) p99 2650 ms; dramatiq 720/s")


def test_batch_row_cut_off_by_its_budget_says_so() -> None:
    rows = {"dispatcher": _batch(700, 2900), "rq": _batch(30, 9e3, done=300)}
    assert "cut off at 300 done" in batch_checks(rows, 2000)[-1].value


def test_batch_latency_counts_from_the_batch_call() -> None:
    figures = batch_figures(
        4,
        100.0,
        [101.0, 102.0, 103.0, 104.0],
        call_s=0.5,
        cpu_s=0.4,
        rss_mb=80,
        complete=True,
        note="",
    )
    assert figures["tasks_per_s"] == 1.0
    assert figures["submit_to_done_p99_ms"] == pytest.approx(3970.0, rel=0.01)


def _cycle(submitted: int, seconds: float, rss: float, drained: bool = True) -> dict[str, Any]:
    return {
        "submitted": submitted,
        "submit_s": seconds / 4,
        "drain_s": seconds * 3 / 4,
        "drained": drained,
        "rss_after_drain_mb": rss,
    }


def test_a_slow_run_shrinks_the_cycles_after_the_warm_up_instead_of_skipping() -> None:
    done = [_cycle(10_000, 40.0, 90.0) for _ in range(WARM_CYCLES)]
    full = cycle_size(WARM_CYCLES, 10_000, done, left_s=200.0)
    assert full.tasks == 10_000 and not full.why
    shrunk = cycle_size(WARM_CYCLES, 10_000, done, left_s=60.0)
    assert MIN_CYCLE_TASKS <= shrunk.tasks < 10_000
    assert "left" in shrunk.why


def test_the_time_left_is_shared_by_the_cycles_still_to_run() -> None:
    # The slow run of 2026-12-03: its fourth cycle took all the time left
    # (7,000 tasks) and the fifth, which growth needs, had none.
    done = [_cycle(10_000, 40.0, 90.0) for _ in range(WARM_CYCLES)]
    per_task_s = (40.0 + 4.0) / 10_000 * PACE_MARGIN
    left_s = 14_500 * per_task_s
    fourth = cycle_size(WARM_CYCLES, 10_000, done, left_s=left_s, cycles=WARM_CYCLES + 2)
    assert MIN_CYCLE_TASKS <= fourth.tasks <= 7_000
    done.append(_cycle(fourth.tasks, 40.0 * fourth.tasks / 10_000, 90.0))
    left_s -= fourth.tasks * per_task_s
    fifth = cycle_size(WARM_CYCLES + 1, 10_000, done, left_s=left_s, cycles=WARM_CYCLES + 2)
    assert fifth.tasks >= MIN_CYCLE_TASKS


def test_the_warm_up_does_not_start_what_leaves_no_time_for_the_cycles_after_it() -> None:
    # Enough for the last warm-up cycle, not for the two measured after it.
    done = [_cycle(10_000, 40.0, 90.0) for _ in range(WARM_CYCLES - 1)]
    left_s = 15_000 * (40.0 + 4.0) / 10_000 * PACE_MARGIN
    skipped = cycle_size(WARM_CYCLES - 1, 10_000, done, left_s=left_s, cycles=WARM_CYCLES + 2)
    assert skipped.tasks == 0
    assert "warm-up" in skipped.why and "BENCH_MEMORY_BUDGET_S" in skipped.why
    room = cycle_size(WARM_CYCLES - 1, 10_000, done, left_s=2 * left_s, cycles=WARM_CYCLES + 2)
    assert room.tasks == 10_000


def test_the_warm_up_is_never_shrunk_and_a_skip_says_why() -> None:
    skipped = cycle_size(1, 10_000, [_cycle(10_000, 60.0, 90.0)], left_s=50.0)
    assert skipped.tasks == 0
    assert "warm-up" in skipped.why and "tasks/s" in skipped.why
    undrained = cycle_size(1, 10_000, [_cycle(10_000, 60.0, 90.0, drained=False)], left_s=500)
    assert undrained.tasks == 0 and "did not drain" in undrained.why


def test_growth_is_read_per_task_when_cycles_differ_in_size() -> None:
    # 1 MB per 10,000 tasks from the last warm drain on, with two half cycles.
    cycles = [_cycle(10_000, 1, 80.0), _cycle(10_000, 1, 85.0), _cycle(10_000, 1, 90.0)]
    cycles += [_cycle(5_000, 1, 90.5), _cycle(5_000, 1, 91.0)]
    assert growth_per_cycle(cycles, 10_000) == pytest.approx(1.0)
    assert math.isnan(growth_per_cycle(cycles[:4], 10_000))


def test_growth_over_the_tolerance_earns_one_more_cycle_and_a_step_passes() -> None:
    # A one-off step of the allocator at the 4th drain, flat after it.
    cycles = [_cycle(10_000, 1, rss) for rss in (80.0, 85.0, 90.0, 93.0, 93.0)]
    assert growth_per_cycle(cycles, 10_000, window=3) > 0.5
    assert "one more cycle" in another_cycle(cycles, 10_000, window=3)
    cycles.append(_cycle(10_000, 1, 93.0))
    assert growth_per_cycle(cycles, 10_000, window=3) == pytest.approx(0.0)
    assert another_cycle(cycles, 10_000, window=3) == ""


def test_a_leak_grows_in_any_window() -> None:
    cycles = [_cycle(10_000, 1, 80.0 + 2 * i) for i in range(7)]
    assert growth_per_cycle(cycles, 10_000, window=3) == pytest.approx(2.0)
    assert another_cycle(cycles, 10_000, window=3)


def test_a_set_up_of_several_rounds_stands_by_its_median_round_whole() -> None:
    rounds = [
        {"tasks_per_s": 171.0, "database": {"round_trips_per_task": 3.4}},
        {"tasks_per_s": 140.0, "database": {"round_trips_per_task": 3.9}},
        {"tasks_per_s": 190.0, "database": {"round_trips_per_task": 3.1}},
    ]
    median = median_run(rounds)
    assert median["tasks_per_s"] == 171.0
    assert median["database"] == {"round_trips_per_task": 3.4}  # that round's own figures
    assert median["tasks_per_s_rounds"] == [171.0, 140.0, 190.0]
    assert median_run(rounds[:2])["tasks_per_s"] == 140.0  # an even count: the lower middle


def _steady(trips: float, claims: float) -> dict[str, Any]:
    database = {
        "round_trips_per_task": trips,
        "round_trip_bound": 3.0,
        "claims_per_task": claims,
        "backend_cpu_ms_per_task": 1.5,
    }
    return {"database": database, "service_cpu_ms_per_task": 4.0, "queue_wait_p50_ms": 0.2}


def test_at_a_steady_rate_each_task_is_claimed_once_within_the_round_trip_bound() -> None:
    one, three = steady_checks(
        {"postgresql_1_host": _steady(2.07, 1.0), "postgresql_3_hosts": _steady(2.21, 1.0)}
    )
    assert one.met is True and three.met is True
    # Three hosts each claiming every task: within the bound, still not met.
    _, herd = steady_checks(
        {"postgresql_1_host": _steady(3.07, 1.0), "postgresql_3_hosts": _steady(2.9, 2.99)}
    )
    assert herd.met is False
    over, _ = steady_checks(
        {"postgresql_1_host": _steady(3.07, 1.0), "postgresql_3_hosts": _steady(2.2, 1.0)}
    )
    assert over.met is False  # the one host's 3.07 > 3.0 (claims do not count there)


def test_a_pace_that_comes_and_goes_is_read_over_every_cycle_so_far() -> None:
    # A loaded run: the first cycle drained in 24 s, the second in 48.
    done = [_cycle(10_000, 24.0, 90.0), _cycle(10_000, 48.0, 90.0)]
    third = cycle_size(2, 10_000, done, left_s=105.0, cycles=WARM_CYCLES + 2)
    assert third.tasks == 10_000


def _result_file(directory: Path, name: str, checks: list[Check]) -> None:
    result = BenchResult(name, name, {}, checks, calibration={"load_avg_1m": 0.5})
    (directory / f"{name}.json").write_text(json.dumps(result.to_json()))


def test_the_summary_holds_every_target_of_the_latest_runs_own_run_included(
    tmp_path: Path,
) -> None:
    # `make bench` wrote mixed and its own wall time; `accounts` ran on its own.
    _result_file(
        tmp_path,
        "mixed",
        [Check("mixed: makespan", "<= 1.02 x", "1.024 x", False), Check("web", "-", "x", None)],
    )
    _result_file(tmp_path, "accounts", [Check("accounts: PSS", "<= 4500 MB", "4340", True)])
    _result_file(tmp_path, HARNESS, [Check("make bench", "<= 600 s", "495 s", True)])

    summary = build_summary(tmp_path, ["mixed", "hosts", "accounts", HARNESS])

    assert [(t["bench"], t["met"]) for t in summary["targets"]] == [
        ("mixed", False),
        ("accounts", True),
        (HARNESS, True),
    ]
    assert summary["not_met"] == ["mixed: makespan"]
    assert summary["not_run"] == ["hosts"]
    assert [r["name"] for r in summary["reported"]] == ["web"]
    assert "met" not in summary["reported"][0]
    assert summary["targets"][0]["calibration"] == {"load_avg_1m": 0.5}


def test_a_ratio_between_set_ups_is_taken_within_each_round_then_its_median() -> None:
    # The machine slowed down in round 2: both set-ups read low, their ratio holds.
    three = [{"tasks_per_s": 330.0}, {"tasks_per_s": 240.0}, {"tasks_per_s": 300.0}]
    one = [{"tasks_per_s": 320.0}, {"tasks_per_s": 230.0}, {"tasks_per_s": 310.0}]
    paired = paired_ratio(three, one)
    assert paired["rounds"] == [1.031, 1.043, 0.968]
    assert paired["ratio"] == 1.031
    # Medians of each set-up alone would read 300 vs 310: below one.
    assert median_run(three)["tasks_per_s"] / median_run(one)["tasks_per_s"] < 1.0


def test_a_set_ups_footprint_is_per_task_and_says_whether_the_cores_were_the_limit() -> None:
    before = Footprint(
        {"services": 1.0}, {7: (False, 0.5), 8: (True, 0.1)}, preempted=10, waited_s=0.2
    )
    after = Footprint(
        {"services": 3.0}, {7: (False, 1.25), 8: (True, 0.1)}, preempted=1010, waited_s=0.7
    )
    figures = after.since(before, tasks=500, span_s=1.5)
    assert figures["cpu_ms_per_task"] == {"services": 4.0, "database": 1.5, "listening": 0.0}
    assert figures["cores_busy"] == 1.83
    assert figures["services_preempted_per_task"] == 2.0
    assert figures["services_waited_ms_per_task"] == 1.0
    # A backend closed meanwhile takes its CPU out of the later sum: no negative share.
    gone = Footprint({"services": 3.0}, {8: (True, 0.1)}, preempted=1010, waited_s=0.7)
    assert gone.since(before, tasks=500, span_s=1.5)["cpu_ms_per_task"]["database"] == 0.0
    # One opened meanwhile counts from nothing.
    opened = Footprint(
        {"services": 3.0}, {7: (False, 1.25), 9: (False, 0.25)}, preempted=1010, waited_s=0.7
    )
    assert opened.since(before, tasks=500, span_s=1.5)["cpu_ms_per_task"]["database"] == 2.0
    # Without PostgreSQL, no database shares.
    sqlite = Footprint({"services": 3.0}, None, preempted=1010, waited_s=0.7)
    assert "database" not in sqlite.since(before, tasks=500, span_s=1.5)["cpu_ms_per_task"]


def test_a_process_on_cpu_time_counts_finer_than_clock_ticks() -> None:
    before = on_cpu_s(os.getpid())
    deadline = time.thread_time() + 0.003  # 3 ms of work: less than one 10 ms tick
    while time.thread_time() < deadline:
        pass
    used_s = on_cpu_s(os.getpid()) - before
    assert 0.002 < used_s < 1.0
    assert schedstat_s(os.getpid())[1] >= 0.0


def test_a_run_says_what_share_of_the_cpus_went_to_other_guests_and_to_io_wait() -> None:
    before = {"user": 100.0, "system": 50.0, "idle": 800.0, "iowait": 40.0, "steal": 10.0}
    after = {"user": 160.0, "system": 70.0, "idle": 840.0, "iowait": 100.0, "steal": 30.0}
    # 200 s of CPU time between the readings: 60 waiting for I/O, 20 stolen.
    assert cpu_shares(before, after) == {"steal_pct": 10.0, "iowait_pct": 30.0}
    assert cpu_shares(before, before) == {"steal_pct": 0.0, "iowait_pct": 0.0}
    # A guest's time is in `user` already (Linux): counted once.
    with_guest = {**after, "user": 260.0, "guest": 100.0}
    assert cpu_shares({**before, "guest": 0.0}, with_guest) == {
        "steal_pct": 6.7,
        "iowait_pct": 20.0,
    }


def test_the_disk_calibration_times_real_fsyncs_and_leaves_nothing(tmp_path: Path) -> None:
    figures = disk_calibration(tmp_path / "work", writes=5)
    assert 0 < figures["fsync_p50_ms"] <= figures["fsync_p99_ms"]
    assert list((tmp_path / "work").iterdir()) == []


def test_a_run_that_was_not_quiet_says_why() -> None:
    quiet = {
        "before": {"loop_3m_wall_s": 0.11},
        "disk_before": {"fsync_p50_ms": 0.2},
        "disk_after": {"fsync_p50_ms": 0.3},
        "steal_pct": 1.2,
        "iowait_pct": 0.4,
    }
    assert noise(quiet) == ""
    assert noise({**quiet, "steal_pct": 25.9}) == "25.9 % of the CPUs' time stolen by other guests"
    slow_disk = {**quiet, "iowait_pct": 33.0, "disk_after": {"fsync_p50_ms": 4.5}}
    assert noise(slow_disk) == "33 % in I/O wait; an fsync took 4.5 ms (p50)"
    # A result file written before these figures existed reads as quiet.
    assert noise({"before": {"loop_3m_wall_s": 0.11}}) == ""


def _rounds(*shares: tuple[float, float]) -> list[dict[str, Any]]:
    return [
        {"tasks_per_s": 100.0, "machine": {"steal_pct": steal, "iowait_pct": iowait}}
        for steal, iowait in shares
    ]


def test_a_round_that_other_guests_or_the_disk_disturbed_is_run_again() -> None:
    quiet = (1.0, 0.5)
    runs = {"a": _rounds(*[quiet] * ROUNDS), "b": _rounds(*[quiet] * ROUNDS)}
    assert quiet_rounds(runs, extra_left=3) == RoundChoice(list(range(ROUNDS)), {}, False)
    # One set-up of round 1 ran while a quarter of the CPUs' time was stolen:
    # the round goes, for both set-ups, and another is due.
    runs["b"][1]["machine"]["steal_pct"] = 25.9
    choice = quiet_rounds(runs, extra_left=3)
    assert 1 not in choice.used and len(choice.used) == ROUNDS - 1
    assert choice.noisy == {1: "25.9 % of the CPUs' time stolen by other guests"}
    assert choice.another
    # With no extra round left, the quiet ones stand.
    assert not quiet_rounds(runs, extra_left=0).another


def test_with_too_few_quiet_rounds_every_round_counts_and_says_why() -> None:
    runs = {"a": _rounds((1.0, 0.5), (1.0, 40.0), (9.0, 0.0), (1.0, 6.0), (0.0, 0.0))}
    choice = quiet_rounds(runs, extra_left=0)
    assert choice.used == [0, 1, 2, 3, 4]
    assert sorted(choice.noisy) == [1, 2, 3]
    assert not choice.another
