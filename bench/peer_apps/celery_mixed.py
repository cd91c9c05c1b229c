"""Benchmark 1 on Celery, as its users would build it.

Two queues, two workers (`bench/mixed_peers.py` starts them with Celery's own
command line): `web` at concurrency 1 (the account's lock: one generation at
a time in its one kept browser) and `api` at concurrency 3 (the provider's
quota). Long tasks as Celery's guide advises: `acks_late`, prefetch 1.
Retries as Celery offers them: a 429 retries after its Retry-After
(`self.retry(countdown=...)`), a broken generation at once, 3 attempts in all.
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery, Task
from celery.signals import worker_process_shutdown

from bench.peer_apps import mixed_jobs as jobs

WEB_ATTEMPTS = 3

_url = os.environ.get("MIXED_REDIS_URL", "redis://127.0.0.1:6379/12")
app = Celery("mixed", broker=_url)
app.conf.update(
    task_acks_late=True,
    worker_prefetch_multiplier=1,
    task_ignore_result=True,
    task_routes={"mixed.web": {"queue": "web"}, "mixed.api": {"queue": "api"}},
    broker_connection_retry_on_startup=True,
)


@app.task(bind=True, name="mixed.api", max_retries=None)
def api(self: Task[Any, Any], index: int, model: str, prompt: str, gen_s: float) -> None:
    jobs.attempt(index)
    try:
        jobs.api_task(index, model, prompt, gen_s)
    except jobs.RateLimited as exc:
        raise self.retry(countdown=exc.retry_after_s, exc=exc) from exc
    except Exception as exc:
        jobs.finished(index, False, jobs.describe(exc))
        raise
    jobs.finished(index, True)


@app.task(bind=True, name="mixed.web", max_retries=WEB_ATTEMPTS - 1)
def web(self: Task[Any, Any], index: int, prompt: str, gen_s: float) -> None:
    if index < 0:
        jobs.web_task(index, prompt, gen_s)  # the warm-up: browser and page up
        return
    jobs.attempt(index)
    try:
        jobs.web_task(index, prompt, gen_s)
    except jobs.BrokenGeneration as exc:
        if self.request.retries < WEB_ATTEMPTS - 1:
            raise self.retry(countdown=0, exc=exc) from exc
        jobs.finished(index, False, jobs.describe(exc))
        raise
    except Exception as exc:
        jobs.finished(index, False, jobs.describe(exc))
        raise
    jobs.finished(index, True)


@worker_process_shutdown.connect
def _close_browser(**_: Any) -> None:
    jobs.BROWSER.close()
