"""The mixed batch itself, apart from how it runs: the seeded plan of 40
tasks, its lower bound, and the figures every system's run is judged by
(ours in `bench.mixed`, Celery's and Dramatiq's in `bench.mixed_peers`, the
hand-built pool in `bench.baseline`), so that all of them are measured the
same way.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bench.common import mean, percentile, r

SEED = 20_241_130
WEB_TASKS = 12
API_TASKS = 28
WEB_RANGE_S = (31.0, 370.0)
API_RANGE_S = (8.0, 20.0)
API_CONCURRENCY = 3  # the provider's default quota
TARGET_LB_S = 90.0  # real seconds; with the overhead the run takes about two minutes
ACCOUNT = "demo-1"
WEB_MODEL = "demo-chat"
API_MODELS = ("demo-chat-api", "demo-video")
TARGET_RATIO = 1.02
TARGET_PLAN_ERROR = 0.15
TARGET_API_WAIT_S = 1.0


@dataclass(frozen=True)
class Planned:
    index: int
    kind: str  # "web" | "api"
    model: str
    nominal_s: float

    @property
    def prompt(self) -> str:
        if self.kind == "web":
            # The demo web model reads its generation time from the prompt.
            return f"mixed #{self.index} [duration={self.nominal_s:.3f}]"
        return f"mixed #{self.index}"

    def task_body(self) -> dict[str, Any]:
        # Every task states its generation seconds as `gen_s` (the profiles'
        # run_s_param): the API demo generates for it; the web demo reads the
        # prompt's directive and lets the param through, as a video page's
        # duration field would set its render time.
        params: dict[str, Any] = {"prompt": self.prompt, "gen_s": round(self.nominal_s, 3)}
        return {"model": self.model, "params": params, "force": True}


@dataclass
class Outcome:
    """One task's life in real seconds since the batch was submitted."""

    index: int
    kind: str
    created: float
    started: float | None
    finished: float | None
    ok: bool
    attempts: int = 1
    error: str = ""


def plan(seed: int = SEED) -> list[Planned]:
    rng = random.Random(seed)
    kinds = ["web"] * WEB_TASKS + ["api"] * API_TASKS
    rng.shuffle(kinds)
    tasks: list[Planned] = []
    api_seen = 0
    for index, kind in enumerate(kinds):
        if kind == "web":
            tasks.append(Planned(index, kind, WEB_MODEL, rng.uniform(*WEB_RANGE_S)))
        else:
            model = API_MODELS[api_seen % len(API_MODELS)]
            api_seen += 1
            tasks.append(Planned(index, kind, model, rng.uniform(*API_RANGE_S)))
    return tasks


def lower_bound_nominal(tasks: Sequence[Planned], api_concurrency: int) -> tuple[float, float]:
    web = sum(t.nominal_s for t in tasks if t.kind == "web")
    api = sum(t.nominal_s for t in tasks if t.kind == "api")
    return web, api / api_concurrency


def time_scale_for(tasks: Sequence[Planned], target_lb_s: float = TARGET_LB_S) -> float:
    return target_lb_s / max(lower_bound_nominal(tasks, API_CONCURRENCY))


def excess_waits(api: Sequence[Outcome], concurrency: int) -> list[float]:
    """Per API task, the wait its lane's quota does not explain.

    In a FIFO lane with `concurrency` slots, the k-th task to start (from 0)
    cannot start before the (k - concurrency)-th finish: that is when a slot
    became free for it. Whatever it waited beyond max(submitted, that
    moment) was caused by something else: the scheduler, or (in the
    baseline) web tasks holding the workers.
    """
    done = [o for o in api if o.started is not None and o.finished is not None]
    finishes = sorted(o.finished for o in done if o.finished is not None)
    free = [-math.inf] * concurrency + finishes
    out = []
    for k, o in enumerate(sorted(done, key=lambda o: o.started or 0.0)):
        assert o.started is not None
        ready = max(o.created, free[k])
        out.append(max(0.0, o.started - ready))
    return out


def analyse(
    tasks: Sequence[Planned], outcomes: Sequence[Outcome], scale: float, cap_s: float | None = None
) -> dict[str, Any]:
    by_index = {o.index: o for o in outcomes}
    web_lb, api_lb = (x * scale for x in lower_bound_nominal(tasks, API_CONCURRENCY))
    lb = max(web_lb, api_lb)
    finished = [o.finished for o in outcomes if o.finished is not None]
    complete = len(finished) == len(tasks) and all(o.ok for o in outcomes)
    makespan = max(finished, default=math.nan) if len(finished) == len(tasks) else math.nan
    api = [by_index[t.index] for t in tasks if t.kind == "api" and t.index in by_index]
    waits = [o.started - o.created for o in api if o.started is not None]
    excess = excess_waits(api, API_CONCURRENCY)
    figures: dict[str, Any] = {
        "lower_bound_s": r(lb),
        "lb_web_s": r(web_lb),
        "lb_api_s": r(api_lb),
        "makespan_s": r(makespan) if math.isfinite(makespan) else None,
        "makespan_over_lb": r(makespan / lb, 4) if math.isfinite(makespan) else None,
        "all_succeeded": complete,
        "succeeded": sum(1 for o in outcomes if o.ok),
        "failed": [
            {"index": o.index, "kind": o.kind, "error": o.error[:200]}
            for o in outcomes
            if o.finished is not None and not o.ok
        ],
        "unfinished": len(tasks) - len(finished),
        "api_wait_mean_s": r(mean(waits)),
        "api_wait_p95_s": r(percentile(waits, 95)),
        "api_wait_max_s": r(max(waits, default=math.nan)),
        "api_excess_wait_mean_s": r(mean(excess)),
        "api_excess_wait_p95_s": r(percentile(excess, 95)),
        "api_excess_wait_max_s": r(max(excess, default=math.nan)),
        # Where the mean comes from: the first starts (the batch's insert) or
        # the refills (an end write, then the next claim).
        "api_excess_wait_ms_in_start_order": [round(x * 1000, 1) for x in excess],
        "attempts_total": sum(o.attempts for o in outcomes),
    }
    if cap_s is not None and not math.isfinite(makespan):
        figures["makespan_s"] = f"> {cap_s:.0f}"
    return figures
