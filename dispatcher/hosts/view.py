"""The hosts sharing one database, as one view (`GET /v1/hosts`, `dispatcher hosts`).

Read from the store, not from this host's memory, so every host answers
the same list: each host's last beat, the web accounts it holds leases on
and the tasks it runs now. A host is `alive` while it beats, `silent` once
its last beat is older than the stale bound (no host has declared it dead
yet), `dead` once one has, or once it stopped cleanly (it signs off).
On SQLite the one host is this one, alive while it answers.
"""

from __future__ import annotations

from collections import Counter, defaultdict

from dispatcher.models import JSON, State
from dispatcher.store import Store


async def hosts_view(store: Store, *, me: str, now: float, stale_s: float) -> list[JSON]:
    hosts = await store.list_hosts()
    leased: dict[str, list[str]] = defaultdict(list)
    for lease in await store.list_leases():
        leased[lease.host].append(lease.account)
    # Running tasks are bounded by the lanes' concurrency of all hosts together.
    running = Counter(t.host for t in await store.tasks_in_state(State.RUNNING))
    answer: list[JSON] = []
    for host in hosts:
        silent_s = max(0.0, now - host.heartbeat_at)
        if host.id == me:
            # Answering is proof of life; on SQLite nothing beats at all.
            state = "alive"
        elif host.dead_at is not None:
            state = "dead"
        else:
            state = "silent" if silent_s > stale_s else "alive"
        answer.append(
            {
                "host": host.id,
                "url": host.url,
                "this_host": host.id == me,
                "state": state,
                "alive": state == "alive",
                "started_at": host.started_at,
                "heartbeat_at": now if host.id == me else host.heartbeat_at,
                "silent_s": 0.0 if host.id == me else silent_s,
                "dead_at": None if host.id == me else host.dead_at,
                "accounts": sorted(leased.get(host.id, [])) if state != "dead" else [],
                "running": running.get(host.id, 0),
            }
        )
    return answer
