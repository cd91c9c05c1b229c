"""Celery: `celery -A bench.peer_apps.celery_app worker -c 5` (prefork pool)."""

from __future__ import annotations

import httpx
from celery import Celery

from bench.peer_apps import QUEUE, answer_text, chat_body, redis_url, vendor_headers, vendor_url

app = Celery("peers", broker=redis_url(), backend=redis_url())
app.conf.task_default_queue = QUEUE
app.conf.broker_connection_retry_on_startup = True

_client: httpx.Client | None = None


def client() -> httpx.Client:
    global _client
    if _client is None:  # one per pool process, created after the fork
        _client = httpx.Client(base_url=vendor_url(), headers=vendor_headers(), timeout=30)
    return _client


@app.task
def call_vendor(i: int) -> str:
    answer = client().post("/v1/chat/completions", json=chat_body(i))
    answer.raise_for_status()
    return answer_text(answer.json())
