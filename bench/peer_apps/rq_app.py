"""RQ: `rq worker-pool -n 5` (each worker forks a work horse per job)."""

from __future__ import annotations

import httpx

from bench.peer_apps import answer_text, chat_body, vendor_headers, vendor_url


def call_vendor(i: int) -> str:
    answer = httpx.post(
        f"{vendor_url()}/v1/chat/completions", json=chat_body(i), headers=vendor_headers()
    )
    answer.raise_for_status()
    return answer_text(answer.json())
