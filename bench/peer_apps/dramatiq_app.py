"""Dramatiq: `dramatiq bench.peer_apps.dramatiq_app --processes 1 --threads 5`."""

from __future__ import annotations

import threading
import time

import dramatiq
import httpx
from dramatiq.brokers.redis import RedisBroker
from dramatiq.results import Results
from dramatiq.results.backends.redis import RedisBackend

from bench.peer_apps import QUEUE, answer_text, chat_body, redis_url, vendor_headers, vendor_url

broker = RedisBroker(url=redis_url())
broker.add_middleware(Results(backend=RedisBackend(url=redis_url())))
dramatiq.set_broker(broker)

_local = threading.local()


def client() -> httpx.Client:
    if not hasattr(_local, "client"):  # httpx.Client is not shared across threads
        _local.client = httpx.Client(base_url=vendor_url(), headers=vendor_headers(), timeout=30)
    return _local.client


@dramatiq.actor(queue_name=QUEUE, store_results=True)
def call_vendor(i: int) -> list[str | float]:
    answer = client().post("/v1/chat/completions", json=chat_body(i))
    answer.raise_for_status()
    # Dramatiq keeps no completion time of its own; the result carries it.
    return [answer_text(answer.json()), time.time()]
