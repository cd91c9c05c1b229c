"""7. Web overhead on a real page: the gradio chat app beside the demo page.

One service (`python -m dispatcher`, time scale 1: the profiles' own
`stable_ms` and timeouts), two web models, each on its own account and
browser (started as the lanes open): `gradio-chat` from
`profiles/examples/gradio-chat.toml` against the real gradio 6 ChatInterface
of `tests/gradio_apps/serve.py`, then `demo-chat` against the bundled demo
page. N tasks each, one job per model, the models one after the other (never
two browsers busy at once on the 2 cores).

A task's overhead is its wall time (claim to `finished_at`, the service's
row) minus the app's own generation time: the gradio app records when each
reply started and ended (`GET /__generations`); the demo page generates for
exactly the `[duration=...]` its prompt names. The gradio figure is split
with the runner's `timings_ms` and the app's clock (both wall clocks of this
machine): ours before the app starts (page check, typing, submit), gradio's
from submit to its function (its frontend, queue and SSE), after the app's
last word until the runner saw the answer finished (gradio streaming it to
the page, then the `done` marker noticed), then the result written. gradio's
own share without a browser: the same prompt sent to the app's HTTP API
(`/gradio_api/call/reply`), wall time minus its generation.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from bench.common import (
    PROFILES_DIR,
    BenchResult,
    Check,
    DemoProc,
    ServiceProc,
    call,
    copy_profile,
    mean,
    percentile,
    r,
)
from tests.gradio_apps.process import GradioProcess
from webrunner.profiledirs import user_data_dir_for

TASKS_PER_MODEL = 8
DIRECT_CALLS = 4
TARGET_OVERHEAD_S = 0.5
DEMO_GENERATION_S = 0.8
GRADIO_ACCOUNT = "gradio-1"
DEMO_ACCOUNT = "demo-1"
# Real seconds gradio gets to import and serve (~5 s quiet, far more when busy).
GRADIO_START_S = 180.0
BROWSERS_READY_S = 60.0


# -- the gradio app ----------------------------------------------------------------
class GradioApps(GradioProcess):
    """`tests/gradio_apps/serve.py`: the chat and image apps on one port."""

    def __init__(self) -> None:
        super().__init__("serve")

    async def wait_serving(self) -> None:
        await self.until_serving("/chat/", GRADIO_START_S)

    async def generations(self) -> dict[str, tuple[float, float]]:
        """Per message, when the app's reply started and ended (wall clock)."""
        async with httpx.AsyncClient() as client:
            listed = (await client.get(f"{self.url}/__generations", timeout=10)).json()
        return {g["message"]: (float(g["start"]), float(g["end"])) for g in listed}

    async def direct_call(self, client: httpx.AsyncClient, message: str) -> float:
        """Wall seconds of one reply through the app's HTTP API (no browser)."""
        t0 = time.time()
        posted = await client.post(
            f"{self.url}/chat/gradio_api/call/reply", json={"data": [message]}
        )
        posted.raise_for_status()
        event_id = posted.json()["event_id"]
        async with client.stream("GET", f"{self.url}/chat/gradio_api/call/reply/{event_id}") as s:
            async for line in s.aiter_lines():
                if line.startswith("event: complete") or line.startswith("event: error"):
                    if "error" in line:
                        raise RuntimeError(f"the gradio app failed on {message!r}")
                    break
        return time.time() - t0


# -- figures -----------------------------------------------------------------------
def _timings(row: dict[str, Any]) -> dict[str, float]:
    raw = (row.get("result") or {}).get("meta", {}).get("timings_ms", {})
    return {k: float(v) / 1000 for k, v in raw.items()}


def _summary(values: Sequence[float]) -> dict[str, float]:
    return {
        "median": r(percentile(values, 50)),
        "mean": r(mean(values)),
        "p90": r(percentile(values, 90)),
        "max": r(max(values, default=float("nan"))),
    }


def gradio_breakdown(
    rows: Sequence[dict[str, Any]], generations: dict[str, tuple[float, float]]
) -> dict[str, Any]:
    """Per task: overhead beyond the app's own generation, and where it went."""
    overheads: list[float] = []
    parts: dict[str, list[float]] = {}
    app_s: list[float] = []
    per_task: list[list[float]] = []
    for row in rows:
        if row["state"] != "success":
            continue
        start, end = generations[row["params"]["prompt"]]
        timings = _timings(row)
        claimed, finished = float(row["started_at"]), float(row["finished_at"])
        ready, submit, generation = timings["ready"], timings["submit"], timings["generation"]
        # The runner's clock starts a hair after the claim; the difference
        # is counted in the first part.
        submitted = claimed + ready + submit
        seen = claimed + ready + generation
        app_s.append(end - start)
        overheads.append((finished - claimed) - (end - start))
        split = {
            "ours_page_ready": ready,
            "ours_type_and_submit": submit,
            "gradio_submit_to_app_start": start - submitted,
            "app_end_to_answer_seen": seen - end,
            "ours_result_to_finished": finished - seen,
        }
        for name, seconds in split.items():
            parts.setdefault(name, []).append(seconds)
        per_task.append([r(overheads[-1]), r(app_s[-1]), *(r(v) for v in split.values())])
    return {
        "tasks": len(overheads),
        "app_generation_s": _summary(app_s),
        "overhead_s": _summary(overheads),
        "overhead_first_s": r(overheads[0]) if overheads else None,
        "parts_mean_s": {k: r(mean(v)) for k, v in parts.items()},
        # Per task: overhead, app generation, then the parts in the order above.
        "per_task_s": per_task,
    }


def demo_breakdown(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    overheads: list[float] = []
    parts: dict[str, list[float]] = {}
    for row in rows:
        if row["state"] != "success":
            continue
        timings = _timings(row)
        wall = float(row["finished_at"]) - float(row["started_at"])
        overheads.append(wall - DEMO_GENERATION_S)
        seen = timings["ready"] + timings["generation"]
        for name, seconds in {
            "ours_page_ready": timings["ready"],
            "ours_type_and_submit": timings["submit"],
            "generation_seen_beyond_duration": timings["generation"]
            - timings["submit"]
            - DEMO_GENERATION_S,
            "ours_result_to_finished": wall - seen,
        }.items():
            parts.setdefault(name, []).append(seconds)
    return {
        "tasks": len(overheads),
        "overhead_s": _summary(overheads),
        "overhead_first_s": r(overheads[0]) if overheads else None,
        "parts_mean_s": {k: r(mean(v)) for k, v in parts.items()},
    }


# -- the run -----------------------------------------------------------------------
def _profiles(target: Path) -> Path:
    target.mkdir(parents=True, exist_ok=True)
    shutil.copy(PROFILES_DIR / "examples" / "gradio-chat.toml", target / "gradio-chat.toml")
    copy_profile(
        target,
        "demo-chat",
        replace={'accounts = ["demo-1", "demo-2"]': f'accounts = ["{DEMO_ACCOUNT}"]'},
    )
    return target


async def _browsers_ready(client: httpx.AsyncClient) -> None:
    """Until both accounts' browsers are up (started as their lanes opened)."""
    deadline = time.monotonic() + BROWSERS_READY_S
    while time.monotonic() < deadline:
        text = (await call(client, "GET", "/metrics")).text
        for line in text.splitlines():
            if (
                line.startswith("dispatcher_browser_prestarts_total ")
                and float(line.split()[1]) >= 2
            ):
                return
        await asyncio.sleep(0.1)


async def _run_job(client: httpx.AsyncClient, model: str, prompts: Sequence[str]) -> list[Any]:
    tasks = [{"model": model, "params": {"prompt": p}, "force": True} for p in prompts]
    answer = await call(client, "POST", "/v1/jobs", json={"name": f"bench {model}", "tasks": tasks})
    answer.raise_for_status()
    job_id = answer.json()["id"]
    deadline = time.monotonic() + 60 + 30 * len(prompts)
    while True:
        job = (await call(client, "GET", f"/v1/jobs/{job_id}")).json()
        if job["state"] != "running":
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"job {model} still running: {job['counts']}")
        await asyncio.sleep(0.25)
    rows: list[Any] = job["tasks"]
    return rows


def _gradio_prompt(i: int) -> str:
    return f"bench {i}: a lighthouse keeper writes the weather in his log at dawn"


async def run(work: Path) -> BenchResult:
    from demo.web_model import demo_login
    from dispatcher.settings import find_browser

    browser = find_browser()
    if browser is None:
        raise RuntimeError("no Chromium found (`make venv` installs one)")
    apps = GradioApps()
    try:
        with DemoProc("web", 1.0) as web:
            await apps.wait_serving()
            async with httpx.AsyncClient(timeout=60) as direct:
                direct_walls = [
                    await apps.direct_call(direct, f"direct {i}: the keeper's log at dawn")
                    for i in range(DIRECT_CALLS)
                ]
            state = work / "state"
            state.mkdir(mode=0o700, parents=True)
            await demo_login(browser, user_data_dir_for(state, DEMO_ACCOUNT), f"{web.url}/chat")
            env = {
                "DISPATCHER_PROFILES_DIR": str(_profiles(work / "profiles")),
                "DISPATCHER_TIME_SCALE": "1.0",
                "DISPATCHER_BROWSER_EXECUTABLE": browser,
                "DEMO_WEB_URL": web.url,
                "GRADIO_CHAT_URL": f"{apps.url}/chat/",
            }
            with ServiceProc(state, env, work / "service.log") as service:
                async with service.async_client(limit=4) as client:
                    await _browsers_ready(client)
                    gradio_rows = await _run_job(
                        client, "gradio-chat", [_gradio_prompt(i) for i in range(TASKS_PER_MODEL)]
                    )
                    demo_rows = await _run_job(
                        client,
                        "demo-chat",
                        [
                            f"bench {i} [duration={DEMO_GENERATION_S}]"
                            for i in range(TASKS_PER_MODEL)
                        ],
                    )
        generations = await apps.generations()
    finally:
        apps.stop()
    direct_gens = [
        end - start for message, (start, end) in generations.items() if message.startswith("direct")
    ]
    gradio = gradio_breakdown(gradio_rows, generations)
    demo = demo_breakdown(demo_rows)
    gradio["gradio_alone_http_api_overhead_s"] = r(mean(direct_walls) - mean(direct_gens))
    figures: dict[str, Any] = {
        "tasks_per_model": TASKS_PER_MODEL,
        "gradio_chat": gradio,
        "demo_chat": demo,
        "failed": [
            {"model": row["model"], "error": (row.get("error") or {}).get("message", "")[:200]}
            for row in [*gradio_rows, *demo_rows]
            if row["state"] != "success"
        ],
    }
    ok = not figures["failed"]
    g_median = gradio["overhead_s"]["median"]
    d_median = demo["overhead_s"]["median"]
    parts = gradio["parts_mean_s"]
    ours = (
        parts["ours_page_ready"] + parts["ours_type_and_submit"] + parts["ours_result_to_finished"]
    )
    app_median = gradio["app_generation_s"]["median"]
    checks = [
        Check(
            "7. gradio chat: per-task overhead beyond the app's generation, median",
            f"<= {TARGET_OVERHEAD_S} s (done marker)",
            f"{g_median:.3f} s, {len(gradio_rows)} tasks (app {app_median:.2f} s; ours "
            f"{ours:.3f}, submit to gradio's fn {parts['gradio_submit_to_app_start']:.3f}, "
            f"app end to answer seen {parts['app_end_to_answer_seen']:.3f}; gradio alone "
            f"{gradio['gradio_alone_http_api_overhead_s']:.3f})",
            ok and g_median <= TARGET_OVERHEAD_S,
        ),
        Check(
            "7. demo page: per-task overhead, median",
            "reported",
            f"{d_median:.3f} s, {len(demo_rows)} tasks",
            None,
        ),
    ]
    notes = [f"load average {os.getloadavg()[0]:.2f} at the end"]
    return BenchResult("webpages", "7. web overhead on a real page", figures, checks, notes)


if __name__ == "__main__":
    result = asyncio.run(run(Path(os.environ.get("BENCH_WORK", "/tmp/bench-webpages"))))
    print(json.dumps(result.figures, indent=2))
    for check in result.checks:
        print(check)
