"""In-process fan-out of state changes to live subscribers (the SSE stream)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

Event = dict[str, Any]

# A subscriber that falls this far behind is dropped rather than let it
# hold memory without bound; its client reconnects and re-reads state.
MAX_BACKLOG = 10_000


class EventBus:
    def __init__(self) -> None:
        self._subscribers: set[asyncio.Queue[Event | None]] = set()
        self._listeners: list[Callable[[Event], None]] = []
        self.published = 0

    def listen(self, callback: Callable[[Event], None]) -> None:
        """A synchronous observer called for every event (metrics)."""
        self._listeners.append(callback)

    def publish(self, event: Event) -> None:
        self.published += 1
        for callback in self._listeners:
            callback(event)
        for queue in list(self._subscribers):
            try:
                queue.put_nowait(event)
            except asyncio.QueueFull:
                self._subscribers.discard(queue)
                with contextlib.suppress(asyncio.QueueFull):
                    queue.put_nowait(None)

    def close(self) -> None:
        for queue in list(self._subscribers):
            with contextlib.suppress(asyncio.QueueFull):
                queue.put_nowait(None)
        self._subscribers.clear()

    @contextlib.asynccontextmanager
    async def subscribe(self) -> AsyncIterator[asyncio.Queue[Event | None]]:
        queue: asyncio.Queue[Event | None] = asyncio.Queue(maxsize=MAX_BACKLOG)
        self._subscribers.add(queue)
        try:
            yield queue
        finally:
            self._subscribers.discard(queue)

    @property
    def subscriber_count(self) -> int:
        return len(self._subscribers)
