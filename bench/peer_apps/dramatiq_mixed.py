"""Benchmark 1 on Dramatiq, as its users would build it.

Two queues, two workers (`bench/mixed_peers.py` starts them with Dramatiq's
own command line): `web` on one thread (the account's lock: one generation at
a time in its one kept browser; sync Playwright stays on its thread) and
`api` on 8 threads behind Dramatiq's own `ConcurrentRateLimiter` of 3 (the
provider's quota), whose refusal Dramatiq retries with its backoff. Retries
as Dramatiq offers them: its defaults (15 s minimum backoff, 7 days maximum)
in the batch's nominal time, a 429 by `dramatiq.Retry` after its
Retry-After, a broken generation up to 3 attempts in all.
"""

from __future__ import annotations

import os

import dramatiq
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import CurrentMessage
from dramatiq.rate_limits import ConcurrentRateLimiter
from dramatiq.rate_limits.backends import RedisBackend

from bench.peer_apps import mixed_jobs as jobs

WEB_ATTEMPTS = 3
QUOTA = 3
API_MAX_RETRIES = 20  # Dramatiq's default
MIN_BACKOFF_MS = max(1, int(15_000 * jobs.scale()))
MAX_BACKOFF_MS = max(1, int(7 * 86_400_000 * jobs.scale()))

_url = os.environ.get("MIXED_REDIS_URL", "redis://127.0.0.1:6379/12")
broker = RedisBroker(url=_url)
broker.add_middleware(CurrentMessage())
dramatiq.set_broker(broker)
provider_quota = ConcurrentRateLimiter(RedisBackend(url=_url), "demo-provider", limit=QUOTA)


def _retries() -> int:
    """How many times Dramatiq has retried the message being processed."""
    message = CurrentMessage.get_current_message()
    return int(message.options.get("retries", 0)) if message is not None else 0


@dramatiq.actor(
    queue_name="api",
    max_retries=API_MAX_RETRIES,
    min_backoff=MIN_BACKOFF_MS,
    max_backoff=MAX_BACKOFF_MS,
)
def api(index: int, model: str, prompt: str, gen_s: float) -> None:
    with provider_quota.acquire():
        jobs.attempt(index)
        try:
            jobs.api_task(index, model, prompt, gen_s)
        except jobs.RateLimited as exc:
            raise dramatiq.Retry(delay=int(exc.retry_after_s * 1000)) from exc
        except Exception as exc:
            if _retries() >= API_MAX_RETRIES:
                jobs.finished(index, False, jobs.describe(exc))
            raise
    jobs.finished(index, True)


@dramatiq.actor(
    queue_name="web",
    max_retries=WEB_ATTEMPTS - 1,
    min_backoff=MIN_BACKOFF_MS,
    max_backoff=MAX_BACKOFF_MS,
)
def web(index: int, prompt: str, gen_s: float) -> None:
    if index < 0:
        jobs.web_task(index, prompt, gen_s)  # the warm-up: browser and page up
        return
    jobs.attempt(index)
    try:
        jobs.web_task(index, prompt, gen_s)
    except Exception as exc:
        if _retries() >= WEB_ATTEMPTS - 1:
            jobs.finished(index, False, jobs.describe(exc))
        raise
    jobs.finished(index, True)
