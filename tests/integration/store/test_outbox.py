"""The webhook outbox contract, on a SQLite file and on PostgreSQL.

Hosts are stores each with their own connections on one database; their
claims race for real.
"""

from __future__ import annotations

import asyncio
from collections import Counter

from dispatcher.store.outbox import OutboxItem
from tests.integration.store.conftest import OpenStore

URL = "http://127.0.0.1:9/hook"
OTHER = "http://127.0.0.1:9/other"


def _item(n: int, url: str = URL, at: float = 10.0) -> OutboxItem:
    return OutboxItem(
        id=f"d{n:03}",
        event_id=f"e{n:03}",
        event="job.finished",
        url=url,
        body='{"event":"job.finished"}',
        state="pending",
        attempts=0,
        next_at=at,
        created_at=at + n / 1000,
    )


async def test_a_delivery_waits_for_its_turn_fails_and_is_redelivered(
    open_stores: OpenStore,
) -> None:
    store = await open_stores("h1")
    box = store.webhook_outbox
    await box.add([_item(1), _item(2, OTHER)])
    assert await box.claim(URL, "h1", now=9.0, hold_until=50.0, limit=5) == []  # not due
    (taken,) = await box.claim(URL, "h1", now=10.0, hold_until=50.0, limit=5)
    assert (taken.id, taken.state, taken.claimed_by, taken.body) == (
        "d001",
        "delivering",
        "h1",
        '{"event":"job.finished"}',
    )
    assert await box.counts() == {"pending": 1, "delivering": 1, "failed": 0}
    # A retry is due again at its time, not before.
    assert await box.finish(
        "d001", "h1", state="pending", attempts=1, next_at=20.0, status=503, error=None, now=11.0
    )
    assert await box.claim(URL, "h1", now=19.0, hold_until=60.0, limit=5) == []
    (again,) = await box.claim(URL, "h1", now=20.0, hold_until=60.0, limit=5)
    assert again.attempts == 1 and again.last_status == 503
    assert await box.finish(
        "d001", "h1", state="failed", attempts=5, next_at=21.0, status=None, error="gone", now=21.0
    )
    (failed,) = await box.items(["failed"], 10)
    assert (failed.id, failed.attempts, failed.last_error) == ("d001", 5, "gone")
    assert failed.to_json()["host"] is None
    # Redelivered: pending now, with a fresh budget; only a failed one.
    redone = await box.redeliver("d001", now=30.0)
    assert redone is not None and (redone.state, redone.attempts) == ("pending", 0)
    assert await box.redeliver("d001", now=30.0) is None
    assert await box.redeliver("nope", now=30.0) is None
    (due,) = await box.claim(URL, "h1", now=30.0, hold_until=70.0, limit=5)
    # Delivered: gone from the outbox.
    assert await box.finish(
        due.id, "h1", state=None, attempts=1, next_at=31.0, status=200, error=None, now=31.0
    )
    assert await box.get("d001") is None
    assert [i.id for i in await box.items(["pending", "delivering", "failed"], 10)] == ["d002"]
    # Failed ones are forgotten after a while; only failed ones.
    await box.add([_item(3, at=40.0)])
    (late,) = await box.claim(URL, "h1", now=40.0, hold_until=80.0, limit=5)
    await box.finish(
        late.id, "h1", state="failed", attempts=5, next_at=41.0, status=500, error=None, now=41.0
    )
    assert await box.forget_failed(updated_before=41.0) == 0
    assert await box.forget_failed(updated_before=42.0) == 1
    assert [i.id for i in await box.items(["pending", "delivering", "failed"], 10)] == ["d002"]


async def test_hosts_claiming_at_once_never_take_the_same_delivery(
    open_stores: OpenStore,
) -> None:
    hosts = [await open_stores(f"h{n}") for n in range(4)]
    await hosts[0].webhook_outbox.add([_item(n) for n in range(40)])
    claimed: Counter[str] = Counter()
    for _ in range(12):
        rounds = await asyncio.gather(
            *(
                s.webhook_outbox.claim(URL, f"h{n}", now=10.0, hold_until=99.0, limit=3)
                for n, s in enumerate(hosts)
            )
        )
        claimed.update(item.id for batch in rounds for item in batch)
    assert len(claimed) == 40 and set(claimed.values()) == {1}


async def test_a_dead_hosts_deliveries_pass_to_another_after_its_hold(
    open_stores: OpenStore,
) -> None:
    a, b = await open_stores("h1"), await open_stores("h2")
    await a.webhook_outbox.add([_item(1), _item(2)])
    held = await a.webhook_outbox.claim(URL, "h1", now=10.0, hold_until=40.0, limit=2)
    assert len(held) == 2
    assert await b.webhook_outbox.claim(URL, "h2", now=39.0, hold_until=80.0, limit=5) == []
    taken = await b.webhook_outbox.claim(URL, "h2", now=41.0, hold_until=80.0, limit=5)
    assert sorted(i.id for i in taken) == ["d001", "d002"]
    # The late first holder's answer no longer counts: the new holder's does.
    assert not await a.webhook_outbox.finish(
        "d001", "h1", state=None, attempts=1, next_at=42.0, status=200, error=None, now=42.0
    )
    # A host that stops puts what it holds back at once, for any host.
    assert await b.webhook_outbox.release("h2", now=43.0) == 2
    assert await a.webhook_outbox.counts() == {"pending": 2, "delivering": 0, "failed": 0}
