"""Waiting for the scheduler's next round: a caller that has just queued
work and has more of its own to do can let that work start first.

Creating a job queues its tasks, then builds its answer (every task's view,
its ETA): a few milliseconds of the event loop for a batch, more on a busy
host, which the job's first tasks would otherwise wait out before a round
claimed them. The caller waits instead for a round begun after its call to
end, bounded: the tasks it claimed have started (their first step is queued
before the waiter's), and the answer is built after.
"""

from __future__ import annotations

import asyncio


class RoundWaiters:
    """Callers waiting for the end of a round begun after they asked."""

    def __init__(self) -> None:
        self.begun = 0
        self._waiting: list[tuple[int, asyncio.Future[None]]] = []

    def begin(self) -> None:
        self.begun += 1

    def ended(self) -> None:
        """The round begun last has ended (or failed): its waiters go on."""
        keep = []
        for round_number, done in self._waiting:
            if round_number > self.begun:
                keep.append((round_number, done))
            elif not done.done():
                done.set_result(None)
        self._waiting = keep

    async def next_round(self, timeout_s: float) -> bool:
        """Until a round begun after this call has ended; False if none did
        within `timeout_s` (the caller goes on all the same)."""
        done = asyncio.get_running_loop().create_future()
        self._waiting.append((self.begun + 1, done))
        try:
            async with asyncio.timeout(timeout_s):
                await done
        except TimeoutError:
            return False
        return True
