"""Benchmark 1: the mixed batch (the production case) against its lower bound.

40 tasks, 12 web and 28 API, durations drawn with a fixed seed from the
field's ranges (web 31-370 s, API 8-20 s) and scaled by one time-scale
factor chosen so that the lower bound is `TARGET_LB_S` real seconds (the run
then takes about two minutes). The API tasks alternate between the chat
model (one request) and the async video model (submit, poll, download), both
on the `demo` provider with its default quota of 3.

Ours: the real service (`python -m dispatcher`) against the demo backends,
each in its own process (`python -m demo api|web`), the web tasks in real
Chromium on one account (`demo-chat` served by `demo-1` only), logged in
once beforehand as an operator would.

The baseline a user would otherwise build (`bench.baseline`): one asyncio
pool of 8 workers taking both kinds FIFO from one queue, calling the same
demo backends directly, the web tasks in one shared Chromium session of the
same account. Two variants: `lock` (web generations serialise behind a lock
while holding their workers) and `shared` (no lock: generations collide and
are retried up to 3 attempts, like ours).

Figures: makespan (first submit to last finish), the lower bound
LB = max(sum of web generation times, sum of API times / API concurrency),
their ratio; per API task the wait from submit to start, and the part of it
that its lane's quota does not explain (`excess`: start minus the moment a
quota slot was free for it in FIFO order; see `excess_waits`), mean and p95;
web-session collisions (the demo site's own count); and where each web
task's time beyond its generation goes (browser start, page, close...).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import os
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from bench.common import (
    BenchResult,
    Check,
    DemoProc,
    ServiceProc,
    call,
    copy_profile,
    fresh_dir,
    mean,
    r,
)
from bench.mixed_batch import (
    ACCOUNT,
    API_CONCURRENCY,
    API_MODELS,
    API_RANGE_S,
    API_TASKS,
    SEED,
    TARGET_API_WAIT_S,
    TARGET_LB_S,
    TARGET_PLAN_ERROR,
    TARGET_RATIO,
    WEB_MODEL,
    WEB_RANGE_S,
    WEB_TASKS,
    Outcome,
    Planned,
    analyse,
    lower_bound_nominal,
    plan,
    time_scale_for,
)
from webrunner.profiledirs import user_data_dir_for

# Real seconds the batch waits, at most, for the service to have started the
# account's browser (a start takes ~0.5-2 s on the 2-core VM).
BROWSER_READY_WAIT_S = 20.0

# -- ours ----------------------------------------------------------------------
# What the operator states in each profile (`expected_run_s`, nominal) before
# the service has run any of its tasks: the field's typical run, the middle
# of its range. The plan made before the batch has nothing else to go on.
EXPECTED_RUN_S = {
    WEB_MODEL: sum(WEB_RANGE_S) / 2,
    **{model: sum(API_RANGE_S) / 2 for model in API_MODELS},
}
DEMO_EXPECTED = {WEB_MODEL: 3, "demo-chat-api": 2, "demo-video": 5}  # the bundled profiles'


def _service_profiles(target: Path) -> Path:
    one_account = {'accounts = ["demo-1", "demo-2"]': f'accounts = ["{ACCOUNT}"]'}
    for model in (WEB_MODEL, *API_MODELS):
        # The bundled API profiles follow gen_s already; the web one is told here.
        follows = 'run_s_param = "gen_s"\nrun_s_per_unit = 1\n' if model == WEB_MODEL else ""
        expected = {
            f"expected_run_s = {DEMO_EXPECTED[model]}\n": (
                f"expected_run_s = {EXPECTED_RUN_S[model]:g}\n{follows}"
            )
        }
        copy_profile(
            target, model, replace={**expected, **(one_account if model == WEB_MODEL else {})}
        )
    return target


async def _plan(
    client: httpx.AsyncClient, tasks: Sequence[Planned], *, param: bool = True
) -> dict[str, Any]:
    """`POST /v1/plan` for the batch: what the service expects it to take
    (`param=False`: the tasks without their gen_s, planned from the profiles'
    typical run or the history, as a batch that states no run time is)."""
    bodies = [t.task_body() for t in tasks]
    if not param:
        for body in bodies:
            body["params"].pop("gen_s")
    answer = await call(client, "POST", "/v1/plan", json={"tasks": bodies})
    answer.raise_for_status()
    plan: dict[str, Any] = answer.json()
    return plan


def own_durations_estimate(tasks: Sequence[Planned], scale: float) -> float:
    """The plan's schedule fed each task's own generation time (which no plan
    is told): what is left of its error is overhead beyond the generations."""
    from dispatcher.tasks.makespan import LaneSlots, PlannedRun, simulate

    lanes = [
        LaneSlots(f"web:{ACCOUNT}", 1, frozenset({WEB_MODEL})),
        LaneSlots("api:demo", API_CONCURRENCY, frozenset(API_MODELS)),
    ]
    runs = [PlannedRun(t.model, t.nominal_s * scale) for t in tasks]
    return simulate(runs, lanes).makespan_s


def plan_figures(
    before: dict[str, Any],
    typical: dict[str, Any],
    after: dict[str, Any],
    makespan_s: float,
    own_s: float,
) -> dict[str, Any]:
    """The plan made before the batch against its actual makespan
    (`plan_error` = |estimate - actual| / actual; each task's gen_s sets its
    run time), the same plan without the param (the profiles' typical run),
    and the plan without it made after the batch, from this run's history
    (what a re-run would be told)."""

    def error(plan: dict[str, Any]) -> float | None:
        estimate = plan["total"]["makespan_s"]
        if estimate is None or not math.isfinite(makespan_s) or makespan_s <= 0:
            return None
        return r(abs(estimate - makespan_s) / makespan_s, 4)

    return {
        "estimate_s": before["total"]["makespan_s"],
        "lower_bound_s": before["total"]["lower_bound_s"],
        "bound": before["total"]["bound"],
        "run_s_by_model": {m["model"]: m["run_s"] for m in before["models"]},
        "plan_error": error(before),
        "typical_estimate_s": typical["total"]["makespan_s"],
        "typical_error": error(typical),
        "replan_from_history_estimate_s": after["total"]["makespan_s"],
        "replan_from_history_error": error(after),
        "own_durations_estimate_s": r(own_s),
        "own_durations_error": error({"total": {"makespan_s": own_s}}),
    }


async def login(browser: str, user_data_dir: Path, web_url: str) -> None:
    """Log the account's browser profile into the demo site, as an operator does once."""
    from demo.web_model import demo_login

    await demo_login(browser, user_data_dir, f"{web_url}/chat")


def _web_breakdown(
    tasks: Sequence[Planned], rows: Sequence[dict[str, Any]], scale: float
) -> dict[str, Any]:
    """Where a web task's wall time beyond its generation goes.

    From the runner's `timings_ms`: the browser start-up parts (self-check,
    launch, CDP connect), the page load and logged-in check (`ready` minus
    those), typing + submit + noticing the answer is done (`generation`
    minus the generation itself), closing the browser, and the rest of the
    task's run (claim to runner, media, writing the result) up to
    `finished_at`.
    """
    parts: dict[str, list[float]] = {}
    overheads: list[float] = []
    starts: list[float] = []
    browser_start: list[float] = []
    page_ready: list[float] = []
    for planned, row in zip(tasks, rows, strict=True):
        if planned.kind != "web" or row["state"] != "success":
            continue
        run_s = row["finished_at"] - row["started_at"]
        gen_s = planned.nominal_s * scale
        overheads.append(run_s - gen_s)
        starts.append(row["started_at"])
        timings = {
            k: float(v) / 1000
            for k, v in (row.get("result") or {}).get("meta", {}).get("timings_ms", {}).items()
        }
        ready = timings.pop("ready", 0.0)
        generation = timings.pop("generation", 0.0)
        submit = timings.pop("submit", 0.0)  # part of `generation`
        close = timings.pop("close", 0.0)
        timings.pop("overhead", None)  # the runner's own sum: ready + close
        browser_start.append(sum(timings.values()))
        for key, seconds in timings.items():
            parts.setdefault(f"browser_{key}", []).append(seconds)
        page_ready.append(ready - sum(timings.values()))
        parts.setdefault("page_load_and_login_check", []).append(page_ready[-1])
        parts.setdefault("type_submit_and_detect_done", []).append(generation - gen_s)
        parts.setdefault("type_and_submit", []).append(submit)
        parts.setdefault("browser_close", []).append(close)
        parts.setdefault("dispatch_media_and_persist", []).append(
            run_s - ready - generation - close
        )
    # The lane's first task pays for the browser (launch, CDP connect) and the
    # first page load with its logged-in check; the others find it open.
    first = min(range(len(starts)), key=starts.__getitem__, default=None)
    warm = [o for i, o in enumerate(overheads) if i != first]
    return {
        "first_task_overhead_s": r(overheads[first]) if first is not None else None,
        "first_task_browser_start_s": r(browser_start[first]) if first is not None else None,
        "first_task_page_load_and_login_check_s": (
            r(page_ready[first]) if first is not None else None
        ),
        "first_task_parts_s": (
            {k: r(v[first]) for k, v in sorted(parts.items())} if first is not None else None
        ),
        "warm_task_overhead_mean_s": r(mean(warm)),
        "per_task_overhead_mean_s": r(mean(overheads)),
        "per_task_overhead_total_s": r(sum(overheads)),
        "per_task_parts_mean_s": {k: r(mean(v)) for k, v in sorted(parts.items())},
    }


async def _browser_ready(client: httpx.AsyncClient, launched: float) -> float | None:
    """Seconds from `python -m dispatcher` until the service has started the
    account's browser before any task (`dispatcher_browser_prestarts_total`);
    None when it starts none (`DISPATCHER_BROWSER_PREWARM=false`, or a login
    problem: then the batch shows it)."""
    if os.environ.get("DISPATCHER_BROWSER_PREWARM", "true").lower() in ("0", "false", "no", "off"):
        return None
    deadline = time.monotonic() + BROWSER_READY_WAIT_S
    while time.monotonic() < deadline:
        text = (await call(client, "GET", "/metrics")).text
        found = re.search(r"^dispatcher_browser_prestarts_total (\S+)$", text, re.M)
        if found is None:
            return None  # a service without the feature
        if float(found.group(1)) >= 1:
            return time.monotonic() - launched
        if f'dispatcher_account_state{{account="{ACCOUNT}",state="ok"}} 0.0' in text:
            return None  # its page showed a login problem: the batch will wait, and say so
        await asyncio.sleep(0.05)
    return None


async def run_ours(work: Path, tasks: Sequence[Planned], scale: float) -> dict[str, Any]:
    from dispatcher.settings import find_browser

    browser = find_browser()
    if browser is None:
        raise RuntimeError("no Chromium found (`make venv` installs one)")
    profiles = _service_profiles(work / "profiles")
    lb = max(lower_bound_nominal(tasks, API_CONCURRENCY)) * scale
    with DemoProc("api", scale, API_CONCURRENCY) as api, DemoProc("web", scale) as web:
        env = {
            "DISPATCHER_PROFILES_DIR": str(profiles),
            "DISPATCHER_TIME_SCALE": repr(scale),
            "DISPATCHER_CONCURRENCY": f'{{"demo": {API_CONCURRENCY}}}',
            "DISPATCHER_BROWSER_EXECUTABLE": browser,
            "DEMO_API_URL": api.url,
            "DEMO_WEB_URL": web.url,
            "DEMO_API_KEY": "bench-mixed-key",
        }
        state = work / "state"
        state.mkdir(mode=0o700, parents=True)
        # Before the service starts, as an operator logs a profile in once:
        # the service starts the account's browser (on this profile) as its
        # lane opens, and holds the profile from then on.
        await login(browser, user_data_dir_for(state, ACCOUNT), web.url)
        # From `python -m dispatcher` to serving, with a web profile: the
        # Playwright driver starts and the accounts are locked before it
        # serves; the account's browser starts in the background.
        launched = time.monotonic()
        with ServiceProc(state, env, work / "service.log") as service:
            startup_s = time.monotonic() - launched
            async with service.async_client(limit=4) as client:
                # The batch comes to a running service, as in production:
                # once the account's browser is up (or the service started
                # none: then at once).
                browser_ready_s = await _browser_ready(client, launched)
                plan_before = await _plan(client, tasks)
                plan_typical = await _plan(client, tasks, param=False)
                t0 = time.time()
                answer = await call(
                    client,
                    "POST",
                    "/v1/jobs",
                    json={"name": "mixed batch", "tasks": [t.task_body() for t in tasks]},
                )
                answer.raise_for_status()
                job_id = answer.json()["id"]
                deadline = time.monotonic() + 3 * lb + 120
                while True:
                    job = (await call(client, "GET", f"/v1/jobs/{job_id}")).json()
                    if job["state"] != "running" or time.monotonic() > deadline:
                        break
                    await asyncio.sleep(0.5)
                # The submit's own clock: created_at of the first row is the t0 that counts.
                t0 = min(t0, min(t["created_at"] for t in job["tasks"]))
                plan_after = await _plan(client, tasks, param=False)
        web_stats = web.stats()
        api_stats = api.stats()
    rows: list[dict[str, Any]] = job["tasks"]
    outcomes = [
        Outcome(
            index=p.index,
            kind=p.kind,
            created=row["created_at"] - t0,
            started=row["started_at"] - t0 if row["started_at"] else None,
            finished=row["finished_at"] - t0 if row["finished_at"] else None,
            ok=row["state"] == "success",
            attempts=row["attempt"],
            error=(row.get("error") or {}).get("message", "") or "",
        )
        for p, row in zip(tasks, rows, strict=True)
    ]
    figures = analyse(tasks, outcomes, scale)
    web_rows = sorted(
        (row for p, row in zip(tasks, rows, strict=True) if p.kind == "web" and row["started_at"]),
        key=lambda row: row["started_at"],
    )
    gaps = [b["started_at"] - a["finished_at"] for a, b in itertools.pairwise(web_rows)]
    makespan = figures["makespan_s"] if figures["makespan_s"] is not None else math.nan
    figures.update(
        {
            "plan": plan_figures(
                plan_before,
                plan_typical,
                plan_after,
                makespan,
                own_durations_estimate(tasks, scale),
            ),
            "startup_to_serving_s": r(startup_s),
            "startup_to_browser_ready_s": r(browser_ready_s) if browser_ready_s else None,
            "web_collisions": web_stats.get("collisions"),
            "web_generations": web_stats.get("generations"),
            "api_rate_limited": api_stats.get("rate_limited"),
            "web": {
                **_web_breakdown(tasks, rows, scale),
                "first_web_start_s": r(web_rows[0]["started_at"] - t0) if web_rows else None,
                "gap_between_web_tasks_mean_s": r(mean(gaps)),
                "gap_between_web_tasks_total_s": r(sum(gaps)),
            },
        }
    )
    return figures


# -- the benchmark ---------------------------------------------------------------
def _fmt(value: Any, unit: str = " s", digits: int = 1) -> str:
    if isinstance(value, int | float) and math.isfinite(value):
        return f"{value:.{digits}f}{unit}"
    return str(value)


# Each baseline stops at this multiple of LB (`make bench` has ten minutes for all
# five benchmarks): `lock` needs about LB plus its per-task page time; `shared`
# has lost every web task to collisions well before its cap.
BASELINE_CAPS = {"lock": 1.4, "shared": 0.67}


def baselines_from_env(default: Sequence[str] = ()) -> tuple[str, ...]:
    """`BENCH_MIXED_BASELINES`: which hand-built baselines to run after ours,
    comma-separated; unset: none (`make bench` compares ours with Celery and
    Dramatiq, `bench.mixed_peers`, which is what a user would build)."""
    raw = os.environ.get("BENCH_MIXED_BASELINES")
    if raw is None:
        return tuple(default)
    names = tuple(n.strip() for n in raw.split(",") if n.strip())
    unknown = [n for n in names if n not in BASELINE_CAPS]
    if unknown:
        raise ValueError(f"BENCH_MIXED_BASELINES: unknown {unknown}; known {list(BASELINE_CAPS)}")
    return names


async def run(
    work: Path,
    *,
    target_lb_s: float = TARGET_LB_S,
    baselines: Sequence[str] | None = None,
    peers: Sequence[str] | None = None,
) -> BenchResult:
    from bench.baseline import run_baseline
    from bench.mixed_peers import peer_checks, peers_from_env, run_peers

    if baselines is None:
        baselines = baselines_from_env()
    if peers is None:
        peers = peers_from_env()

    work = fresh_dir(work)
    tasks = plan()
    scale = time_scale_for(tasks, target_lb_s)
    web_nominal, api_nominal = lower_bound_nominal(tasks, API_CONCURRENCY)
    # The peers run at the same time as ours, each on its own backends: the
    # batch is mostly waiting on generations, and the same moment means the
    # same load from the machine's other tenants for every system.
    beside = asyncio.create_task(
        run_peers(peers, work / "peers", tasks, scale, max(web_nominal, api_nominal) * scale)
    )
    try:
        ours = await run_ours(work / "ours", tasks, scale)
    except BaseException:
        beside.cancel()  # the peers' workers and browsers stop with ours
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await beside
        raise
    peer_rows = await beside
    figures: dict[str, Any] = {
        "seed": SEED,
        "tasks": {"web": WEB_TASKS, "api": API_TASKS},
        "time_scale": r(scale, 6),
        "sum_web_nominal_s": r(web_nominal, 1),
        "sum_api_nominal_s": r(api_nominal * API_CONCURRENCY, 1),
        "api_concurrency": API_CONCURRENCY,
        "ours": ours,
        "peers": peer_rows,
        "baselines": {},
    }
    lb = ours["lower_bound_s"]
    for variant in baselines:
        cap_s = BASELINE_CAPS[variant] * lb
        outcomes, extra = await run_baseline(
            work / f"baseline-{variant}", tasks, scale, variant, cap_s=cap_s, workers=8
        )
        figures["baselines"][variant] = {**analyse(tasks, outcomes, scale, cap_s=cap_s), **extra}
    ratio = ours["makespan_over_lb"]
    checks = [
        Check(
            "mixed: makespan vs lower bound",
            f"<= {TARGET_RATIO:.2f} x LB",
            f"{_fmt(ours['makespan_s'])} vs LB {lb:.1f} s = "
            + (f"{ratio:.3f} x" if ratio else "unfinished"),
            bool(ratio and ratio <= TARGET_RATIO and ours["all_succeeded"]),
        ),
        Check(
            "mixed: API mean wait (beyond the quota)",
            f"< {TARGET_API_WAIT_S:g} s",
            f"{ours['api_excess_wait_mean_s']:.3f} s (p95 {ours['api_excess_wait_p95_s']:.3f} s; "
            f"raw submit->start mean {ours['api_wait_mean_s']:.1f} s)",
            ours["api_excess_wait_mean_s"] < TARGET_API_WAIT_S,
        ),
        Check(
            "mixed: web-session collisions",
            "0",
            str(ours["web_collisions"]),
            ours["web_collisions"] == 0,
        ),
    ]
    planned = ours["plan"]
    plan_error = planned["plan_error"]
    checks.append(
        Check(
            "mixed: plan's makespan estimate vs the run",
            f"<= {TARGET_PLAN_ERROR:.2f} error",
            f"POST /v1/plan before the batch {_fmt(planned['estimate_s'])} vs "
            f"{_fmt(ours['makespan_s'])} = "
            + (f"{plan_error:.3f}" if plan_error is not None else "not estimated")
            + " (no history yet: each task's gen_s sets its run time, the profiles' "
            "run_s_param; without it, the profiles' typical expected_run_s "
            f"{_fmt(planned['typical_estimate_s'])}, error {planned['typical_error']}; "
            "the schedule fed each "
            f"task's own generation time {_fmt(planned['own_durations_estimate_s'])}, error "
            f"{planned['own_durations_error']}; re-planned from this run's history "
            f"{_fmt(planned['replan_from_history_estimate_s'])}, error "
            f"{planned['replan_from_history_error']})",
            bool(plan_error is not None and plan_error <= TARGET_PLAN_ERROR),
        )
    )
    web = ours.get("web") or {}
    checks.append(
        Check(
            "mixed: web lane, first task vs warm",
            "reported (overhead beyond generation)",
            f"`python -m dispatcher` to serving {_fmt(ours.get('startup_to_serving_s'), ' s', 2)}"
            f"; first task {_fmt(web.get('first_task_overhead_s'), ' s', 3)} (browser start "
            f"{_fmt(web.get('first_task_browser_start_s'), ' s', 3)}, page load + login check "
            f"{_fmt(web.get('first_task_page_load_and_login_check_s'), ' s', 3)}), warm mean "
            f"{_fmt(web.get('warm_task_overhead_mean_s'), ' s', 3)}",
            None,
        )
    )
    checks += peer_checks(ours, peer_rows)
    for variant, base in figures["baselines"].items():
        checks.append(
            Check(
                f"mixed: baseline 8-worker pool ({variant})",
                "much worse than ours (reported)",
                f"makespan {_fmt(base['makespan_s'])}, API excess wait mean "
                f"{_fmt(base['api_excess_wait_mean_s'])}, collisions {base.get('web_collisions')}, "
                f"failed {len(base['failed'])}",
                None,
            )
        )
    return BenchResult(
        "mixed", "Mixed batch: 12 web + 28 API tasks against the lower bound", figures, checks
    )
