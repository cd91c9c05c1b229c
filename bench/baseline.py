"""The baseline a user would otherwise build, for benchmark 1.

One asyncio pool of 8 workers taking tasks FIFO from one queue holding both
kinds, calling the same demo backends directly (each in its own process, as
for the service):

- API chat: one request; a 429 waits the Retry-After it carries, then again.
- API video: submit (429 handled the same way), poll every second (scaled),
  download.
- Web: one Chromium kept open on the account's logged-in profile for the
  whole batch (as the service keeps its account's browser); each
  web task opens a tab, types the prompt, waits for the answer's done marker
  or an error banner, closes the tab. A broken generation is retried, up to
  3 attempts like the service.

Variants: `lock` puts an asyncio.Lock around each web generation, so web
tasks serialise but keep their workers while they wait; `shared` has no
lock, so generations started in the same session collide and break.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from bench.common import DemoProc, fresh_dir
from bench.mixed import login
from bench.mixed_batch import API_CONCURRENCY, Outcome, Planned

MAX_ATTEMPTS = 3
API_KEY = "baseline-key"


def _retry_after_s(response: httpx.Response) -> float:
    millis = response.headers.get("retry-after-ms")
    if millis is not None:
        return float(millis) / 1000
    return float(response.headers.get("retry-after", "1"))


class Pool:
    def __init__(
        self, api_url: str, web_url: str, context: Any, scale: float, variant: str, t0: float
    ) -> None:
        self.api_url = api_url
        self.web_url = web_url
        self.context = context
        self.scale = scale
        self.variant = variant
        self.t0 = t0
        self.lock = asyncio.Lock()
        self.outcomes: dict[int, Outcome] = {}
        self.rate_limited = 0
        self.broken_generations = 0

    def now(self) -> float:
        return time.monotonic() - self.t0

    async def worker(self, queue: asyncio.Queue[Planned], http: httpx.AsyncClient) -> None:
        while True:
            try:
                task = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            outcome = Outcome(
                task.index, task.kind, created=0.0, started=None, finished=None, ok=False
            )
            self.outcomes[task.index] = outcome
            try:
                if task.kind == "web":
                    await self.web(task, outcome)
                else:
                    await self.api(task, outcome, http)
                outcome.ok = True
            except Exception as exc:
                outcome.error = f"{type(exc).__name__}: {exc}"
            outcome.finished = self.now()

    # -- API ---------------------------------------------------------------------
    async def _send(
        self, http: httpx.AsyncClient, outcome: Outcome, url: str, body: dict[str, Any]
    ) -> httpx.Response:
        """POST until accepted; the task starts when the provider accepts it."""
        while True:
            sent = self.now()
            answer = await http.post(url, json=body)
            if answer.status_code == 429:
                self.rate_limited += 1
                await asyncio.sleep(_retry_after_s(answer))
                continue
            answer.raise_for_status()
            outcome.started = sent
            return answer

    async def api(self, task: Planned, outcome: Outcome, http: httpx.AsyncClient) -> None:
        if task.model == "demo-chat-api":
            body = {
                "model": "demo-chat",
                "gen_s": round(task.nominal_s, 3),
                "messages": [{"role": "user", "content": task.prompt}],
            }
            await self._send(http, outcome, f"{self.api_url}/v1/chat/completions", body)
            return
        body = {"model": "sora-2", "prompt": task.prompt, "gen_s": round(task.nominal_s, 3)}
        answer = await self._send(http, outcome, f"{self.api_url}/v1/videos", body)
        video = answer.json()["id"]
        while True:
            await asyncio.sleep(1.0 * self.scale)
            status = (await http.get(f"{self.api_url}/v1/videos/{video}")).json()
            if status["status"] == "completed":
                break
            if status["status"] in ("failed", "cancelled"):
                raise RuntimeError(f"video {status['status']}")
        (await http.get(f"{self.api_url}/v1/videos/{video}/content")).raise_for_status()

    # -- web ---------------------------------------------------------------------
    async def web(self, task: Planned, outcome: Outcome) -> None:
        for attempt in range(1, MAX_ATTEMPTS + 1):
            outcome.attempts = attempt
            if self.variant == "lock":
                async with self.lock:
                    ok, error = await self.generate(task, outcome)
            else:
                ok, error = await self.generate(task, outcome)
            if ok:
                return
            self.broken_generations += 1
            outcome.error = error
        raise RuntimeError(f"web task failed {MAX_ATTEMPTS} times: {outcome.error}")

    async def generate(self, task: Planned, outcome: Outcome) -> tuple[bool, str]:
        page = await self.context.new_page()
        try:
            await page.goto(f"{self.web_url}/chat", wait_until="domcontentloaded")
            await page.fill("#composer textarea", task.prompt)
            if outcome.started is None:
                outcome.started = self.now()
            await page.click("#send")
            ended = page.locator(".msg.assistant[data-done]").or_(page.locator(".error-banner"))
            timeout_ms = (task.nominal_s * self.scale * 3 + 60) * 1000
            await ended.first.wait_for(state="attached", timeout=timeout_ms)
            if await page.locator(".error-banner").count():
                return False, await page.locator(".error-banner").first.inner_text()
            return True, ""
        finally:
            with contextlib.suppress(Exception):
                await page.close()


async def run_baseline(
    work: Path,
    tasks: Sequence[Planned],
    scale: float,
    variant: str,
    *,
    cap_s: float,
    workers: int = 8,
) -> tuple[list[Outcome], dict[str, Any]]:
    from playwright.async_api import async_playwright

    from dispatcher.settings import find_browser

    browser = find_browser()
    if browser is None:
        raise RuntimeError("no Chromium found")
    work = fresh_dir(work)
    profile = work / "profile"
    with DemoProc("api", scale, API_CONCURRENCY) as api, DemoProc("web", scale) as web:
        await login(browser, profile, web.url)
        async with async_playwright() as pw:
            context = await pw.chromium.launch_persistent_context(
                str(profile), executable_path=browser, headless=True
            )
            try:
                queue: asyncio.Queue[Planned] = asyncio.Queue()
                for task in tasks:
                    queue.put_nowait(task)
                headers = {"Authorization": f"Bearer {API_KEY}"}
                async with httpx.AsyncClient(headers=headers, timeout=120) as http:
                    pool = Pool(api.url, web.url, context, scale, variant, time.monotonic())
                    jobs = [asyncio.create_task(pool.worker(queue, http)) for _ in range(workers)]
                    finished_in_time = True
                    try:
                        await asyncio.wait_for(asyncio.gather(*jobs), timeout=cap_s)
                    except TimeoutError:
                        finished_in_time = False
            finally:
                await context.close()
        web_stats = web.stats()
        api_stats = api.stats()
    outcomes = list(pool.outcomes.values())
    extra = {
        "variant": variant,
        "workers": workers,
        "finished_within_cap": finished_in_time,
        "cap_s": round(cap_s, 1),
        "web_collisions": web_stats.get("collisions"),
        "web_generations": web_stats.get("generations"),
        "broken_generations_retried": pool.broken_generations,
        "api_rate_limited": api_stats.get("rate_limited"),
    }
    return outcomes, extra
