"""The same job written for each peer task queue, as its users would write it.

One job function per library: one POST to the demo vendor's chat endpoint
with httpx (the vendor answers at once), its answer's text as the result.
The benchmark (`bench/peers.py`) starts each library's worker with its own
command line and concurrency 5, and passes where things are through the
environment: `PEER_VENDOR_URL`, `PEER_VENDOR_KEY`, `PEER_REDIS_URL`,
`PEER_PG_DSN`.
"""

from __future__ import annotations

import os
from typing import Any

QUEUE = "peers"
CONCURRENCY = 5


def vendor_url() -> str:
    return os.environ.get("PEER_VENDOR_URL", "http://127.0.0.1:9")


def vendor_headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {os.environ.get('PEER_VENDOR_KEY', 'peer')}"}


def redis_url() -> str:
    return os.environ.get("PEER_REDIS_URL", "redis://127.0.0.1:6379/0")


def pg_dsn() -> str:
    return os.environ.get("PEER_PG_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")


def chat_body(i: int) -> dict[str, Any]:
    return {
        "model": "demo-chat",
        "messages": [{"role": "user", "content": f"peer task {i}"}],
        "gen_s": 0,
    }


def answer_text(data: Any) -> str:
    return str(data["choices"][0]["message"]["content"])
