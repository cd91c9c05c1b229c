"""arq: an async worker (`arq bench.peer_apps.arq_app.WorkerSettings`)."""

from __future__ import annotations

from typing import Any, ClassVar

import httpx
from arq.connections import RedisSettings

from bench.peer_apps import (
    CONCURRENCY,
    answer_text,
    chat_body,
    redis_url,
    vendor_headers,
    vendor_url,
)


async def startup(ctx: dict[str, Any]) -> None:
    ctx["http"] = httpx.AsyncClient(base_url=vendor_url(), headers=vendor_headers(), timeout=30)


async def shutdown(ctx: dict[str, Any]) -> None:
    await ctx["http"].aclose()


async def call_vendor(ctx: dict[str, Any], i: int) -> str:
    answer = await ctx["http"].post("/v1/chat/completions", json=chat_body(i))
    answer.raise_for_status()
    return answer_text(answer.json())


class WorkerSettings:
    functions: ClassVar[list[Any]] = [call_vendor]
    on_startup = startup
    on_shutdown = shutdown
    max_jobs = CONCURRENCY
    redis_settings = RedisSettings.from_dsn(redis_url())
    keep_result = 3600
