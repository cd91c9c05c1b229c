"""procrastinate (PostgreSQL): `procrastinate --app=... worker --concurrency 5`."""

from __future__ import annotations

import httpx
import procrastinate

from bench.peer_apps import QUEUE, answer_text, chat_body, pg_dsn, vendor_headers, vendor_url

app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=pg_dsn()))

_client: httpx.AsyncClient | None = None


@app.task(queue=QUEUE)
async def call_vendor(i: int) -> str:
    global _client
    if _client is None:
        _client = httpx.AsyncClient(base_url=vendor_url(), headers=vendor_headers(), timeout=30)
    answer = await _client.post("/v1/chat/completions", json=chat_body(i))
    answer.raise_for_status()
    return answer_text(answer.json())
