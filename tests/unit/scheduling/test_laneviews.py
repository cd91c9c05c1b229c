"""The lanes view's queue counts: read again only after a task changed, or
after `QUEUED_KEEP_S` (`laneviews.QueuedCounts`)."""

from __future__ import annotations

import asyncio

from dispatcher.scheduling.laneviews import QueuedCounts


class Reads:
    def __init__(self) -> None:
        self.counts = {"q": 1}
        self.calls = 0
        self.hold: asyncio.Event | None = None

    async def __call__(self) -> dict[str, int]:
        self.calls += 1
        if self.hold is not None:
            await self.hold.wait()
        return dict(self.counts)


async def test_counts_are_read_again_only_after_a_change_or_the_keep_bound() -> None:
    reads = Reads()
    queued = QueuedCounts(reads)
    assert await queued.get(0.0, 5.0) == {"q": 1}
    # Looks every half second at idle lanes: no read.
    for step in range(1, 9):
        assert await queued.get(step * 0.5, 5.0) == {"q": 1}
    assert reads.calls == 1
    # A task changed: the next look reads.
    reads.counts = {"q": 2}
    queued.changed()
    assert await queued.get(4.6, 5.0) == {"q": 2}
    assert reads.calls == 2
    # Nothing heard for the keep bound: read all the same.
    reads.counts = {"q": 3}
    assert await queued.get(9.7, 5.0) == {"q": 3}
    assert reads.calls == 3


async def test_a_read_in_flight_when_a_change_is_heard_is_not_kept() -> None:
    reads = Reads()
    queued = QueuedCounts(reads)
    reads.hold = asyncio.Event()
    look = asyncio.create_task(queued.get(0.0, 5.0))
    await asyncio.sleep(0)
    queued.changed()  # after the read was sent: it may predate the change
    reads.hold.set()
    assert await look == {"q": 1}
    reads.hold = None
    reads.counts = {"q": 0}
    assert await queued.get(0.1, 5.0) == {"q": 0}
    assert reads.calls == 2
