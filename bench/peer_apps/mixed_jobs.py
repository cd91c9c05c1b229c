"""Benchmark 1's jobs as a queue library's user writes them (sync code).

What `celery_mixed` and `dramatiq_mixed` share: the two API calls on the
demo provider (a chat completion; a video submitted, polled every scaled
second, downloaded), the web generation in one Chromium kept open on the
account's logged-in profile (a new tab per task, as `bench/baseline.py`
drives the page), and where each task's times go: a Redis hash per task that
the benchmark reads back (the libraries keep no start time of their own).

Set by the benchmark (`bench/mixed_peers.py`) in the workers' environment:
`MIXED_API_URL`, `MIXED_WEB_URL`, `MIXED_SCALE`, `MIXED_PROFILE` (the
account's logged-in user data dir), `MIXED_BROWSER`, `MIXED_REDIS_URL`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from typing import TYPE_CHECKING, Any

import httpx

if TYPE_CHECKING:  # the bench extra's; the checks `make unit` imports need none of it
    import redis

API_KEY = "peer-mixed-key"
# Dramatiq's workers log at INFO: one line per HTTP request is not the job's.
logging.getLogger("httpx").setLevel(logging.WARNING)


class RateLimited(Exception):
    """The provider answered 429: the library retries after `retry_after_s`."""

    def __init__(self, retry_after_s: float) -> None:
        super().__init__(f"429, retry after {retry_after_s:.3f} s")
        self.retry_after_s = retry_after_s


class BrokenGeneration(Exception):
    """The web page showed an error banner (e.g. a collision)."""


def scale() -> float:
    return float(os.environ.get("MIXED_SCALE", "1"))


_redis: redis.Redis | None = None


def store() -> redis.Redis:
    global _redis
    if _redis is None:
        import redis

        _redis = redis.Redis.from_url(
            os.environ.get("MIXED_REDIS_URL", "redis://127.0.0.1:6379/12")
        )
    return _redis


def key(index: int) -> str:
    return f"mixed:task:{index}"


def attempt(index: int) -> None:
    store().hincrby(key(index), "attempts", 1)


def started(index: int, at: float) -> None:
    store().hsetnx(key(index), "started", repr(at))


def finished(index: int, ok: bool, error: str = "") -> None:
    store().hset(
        key(index), mapping={"finished": repr(time.time()), "ok": int(ok), "error": error[:300]}
    )


def read_all(conn: redis.Redis, indexes: list[int]) -> list[dict[str, str]]:
    """The records of these tasks, in one round trip (empty for a task not started)."""
    pipe = conn.pipeline(transaction=False)
    for index in indexes:
        pipe.hgetall(key(index))
    return [{k.decode(): v.decode() for k, v in raw.items()} for raw in pipe.execute()]


# -- API ------------------------------------------------------------------------------
_http: httpx.Client | None = None


def http() -> httpx.Client:
    global _http
    if _http is None:  # one per worker process, after the fork
        _http = httpx.Client(
            base_url=os.environ.get("MIXED_API_URL", "http://127.0.0.1:9"),
            headers={"Authorization": f"Bearer {API_KEY}"},
            timeout=120,
        )
    return _http


def _retry_after_s(response: httpx.Response) -> float:
    millis = response.headers.get("retry-after-ms")
    if millis is not None:
        return float(millis) / 1000
    return float(response.headers.get("retry-after", "1"))


def _send(index: int, path: str, body: dict[str, Any]) -> httpx.Response:
    sent = time.time()
    answer = http().post(path, json=body)
    if answer.status_code == 429:
        raise RateLimited(_retry_after_s(answer))
    answer.raise_for_status()
    started(index, sent)  # the task starts when the provider accepts it
    return answer


def api_task(index: int, model: str, prompt: str, gen_s: float) -> None:
    if model == "demo-chat-api":
        body = {
            "model": "demo-chat",
            "gen_s": gen_s,
            "messages": [{"role": "user", "content": prompt}],
        }
        _send(index, "/v1/chat/completions", body)
        return
    answer = _send(index, "/v1/videos", {"model": "sora-2", "prompt": prompt, "gen_s": gen_s})
    video = answer.json()["id"]
    while True:
        time.sleep(1.0 * scale())
        status = http().get(f"/v1/videos/{video}").json()
        if status["status"] == "completed":
            break
        if status["status"] in ("failed", "cancelled"):
            raise RuntimeError(f"video {status['status']}")
    http().get(f"/v1/videos/{video}/content").raise_for_status()


# -- web ------------------------------------------------------------------------------
class Browser:
    """One Chromium on the account's profile, kept open for the worker's life.

    Sync Playwright is bound to the thread that started it: the web queue's
    worker runs one thread (concurrency 1), which is also the per-account lock.
    """

    def __init__(self) -> None:
        self._manager: Any = None
        self._context: Any = None

    def context(self) -> Any:
        if self._context is None:
            from playwright.sync_api import sync_playwright

            self._manager = sync_playwright().start()
            try:
                self._context = self._manager.chromium.launch_persistent_context(
                    os.environ["MIXED_PROFILE"],
                    executable_path=os.environ.get("MIXED_BROWSER") or None,
                    headless=True,
                )
            except BaseException:
                # A second `sync_playwright()` in this thread while the first
                # still runs raises: a launch that failed once (a busy machine)
                # would fail every retry after it, and the worker with them.
                self.close()
                raise
        return self._context

    def close(self) -> None:
        with contextlib.suppress(Exception):
            if self._context is not None:
                self._context.close()
            if self._manager is not None:
                self._manager.stop()
        self._context = self._manager = None


BROWSER = Browser()


def web_task(index: int, prompt: str, gen_s: float) -> None:
    """One generation in a new tab; raises BrokenGeneration on the page's error banner."""
    page = BROWSER.context().new_page()
    try:
        page.goto(f"{os.environ['MIXED_WEB_URL']}/chat", wait_until="domcontentloaded")
        if index < 0:  # the warm-up: the browser and the page are up
            _logged_in(page)
            finished(index, True)
            return
        page.fill("#composer textarea", prompt)
        started(index, time.time())
        page.click("#send")
        ended = page.locator(".msg.assistant[data-done]").or_(page.locator(".error-banner"))
        ended.first.wait_for(state="attached", timeout=(gen_s * 3 + 60) * 1000)
        if page.locator(".error-banner").count():
            raise BrokenGeneration(page.locator(".error-banner").first.inner_text())
    finally:
        with contextlib.suppress(Exception):
            page.close()


def _logged_in(page: Any) -> None:
    """The chat's composer shown, after logging in if the profile is not.

    The harness logs the profile in before the workers start (`demo_login`),
    but Chromium writes the session cookie into the profile lazily: a login
    browser that did not get to write it (three systems starting on two
    cores) left the worker's page on the login form, and the peer did not
    run. A user's worker would log in again: so does this one, once.
    """
    page.locator("#composer").or_(page.locator("#login-form")).first.wait_for(
        state="visible", timeout=30_000
    )
    if not page.locator("#composer").is_visible():
        page.fill("#login-form input[name=username]", "demo")
        page.fill("#login-form input[name=password]", "demo")
        page.click("#login-form button[type=submit]")
    page.locator("#composer").wait_for(state="visible", timeout=30_000)


def describe(exc: BaseException) -> str:
    return json.dumps(f"{type(exc).__name__}: {exc}")[1:-1]
