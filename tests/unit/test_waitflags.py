"""On one host the claim knows, without asking the store each time, whether
fallbacks wait and whether a queue holds ranked tasks (`tasks.waitflags`);
a task that needs either is still found by the very next claim."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from dispatcher.clock import FakeClock
from dispatcher.events import EventBus
from dispatcher.store.sqlite import SqliteStore
from dispatcher.tasks.ledger import Ledger
from dispatcher.tasks.spec import TaskSpec
from tests.support.helpers import api_profile

A = "api-model:a"
B = "api-model:b"


class CountingStore(SqliteStore):
    """The SQLite store, counting the questions a claim asks before claiming."""

    asked = 0

    async def ranked_waiting(self, queues: Sequence[str]) -> bool:
        self.asked += 1
        return await super().ranked_waiting(queues)

    async def fallbacks_waiting(self) -> bool:
        self.asked += 1
        return await super().fallbacks_waiting()


@pytest.fixture
async def ledger(tmp_path: Path) -> AsyncIterator[Ledger]:
    store = CountingStore(tmp_path / "d.db")
    await store.migrate()
    profiles = {p.name: p for p in (api_profile("a", "pa"), api_profile("b", "pb"))}
    yield Ledger(store, FakeClock(), profiles, EventBus(), retry_delay_s=0.0)
    await store.close()


def _asked(ledger: Ledger) -> int:
    assert isinstance(ledger.store, CountingStore)
    return ledger.store.asked


async def test_claims_stop_asking_once_told_none_and_still_find_new_ones(ledger: Ledger) -> None:
    plain = [(await ledger.submit(TaskSpec("a", {"prompt": f"p{i}"}))).task for i in range(3)]
    first = await ledger.claim([A], "pa")
    assert first is not None and first.id == plain[0].id
    asked = _asked(ledger)
    assert asked == 2  # whether ranked, whether fallbacks: both "none"
    assert await ledger.claim([A], "pa") is not None
    assert _asked(ledger) == asked  # known: no question before this claim
    # A fallback naming b, and a ranked task of a: the next claims see both.
    fallback = await ledger.submit(TaskSpec("a", {"prompt": "either"}, fallbacks=("b",)))
    urgent = await ledger.submit(TaskSpec("a", {"prompt": "urgent"}, priority=5))
    taken = await ledger.claim([B], "pb")
    assert taken is not None and taken.id == fallback.task.id
    ranked = await ledger.claim([A], "pa")
    assert ranked is not None and ranked.id == urgent.task.id
    assert _asked(ledger) > asked
    # Drained again: told "none" once more, then known.
    assert await ledger.claim([A], "pa") is not None
    assert await ledger.claim([A], "pa") is None
    settled = _asked(ledger)
    assert await ledger.claim([A], "pa") is None and _asked(ledger) == settled


async def test_with_several_hosts_every_claim_asks(ledger: Ledger) -> None:
    ledger.flags.shared = True
    await ledger.submit(TaskSpec("a", {"prompt": "p"}))
    await ledger.claim([A], "pa")
    await ledger.claim([A], "pa")
    assert _asked(ledger) == 4
