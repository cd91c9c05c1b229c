"""In-process fan-out of state changes to live subscribers (the SSE stream).

An event is one of a few small frozen dataclasses; listeners match on the
type (`match event: case TaskChanged(task=task): ...`). `to_json()` is the
SSE `data:` of the event, and its `type` the SSE event name: that shape is
what the dashboard and outside SSE clients read, so it stays as it is.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from dispatcher.accounts.health import AccountState
from dispatcher.models import JSON, Kind, State, Task


@dataclass(frozen=True, slots=True)
class TaskChanged:
    """A task was created or changed state (or a cancel was asked for it)."""

    # The ledger's fresh copy of the row; nothing changes a `Task` in place, so
    # serialising it when a subscriber reads the event shows the row as written.
    task: Task
    # The other host whose write this was (heard through the database; see
    # `dispatcher.hosts.crosshost`); None for this host's own. Counters and
    # webhooks count only their own host's writes, so that several hosts
    # never count or announce one change twice.
    origin: str | None = None

    def to_json(self) -> JSON:
        return {"type": "task", "task": self.task.to_json()}


@dataclass(frozen=True, slots=True)
class TaskNoticed:
    """Another host changed a task, told by its notice's header alone (the
    row not decoded): for the listeners (the scheduler's wake-ups and
    cancels) while no stream subscribes. A subscriber gets `TaskChanged`,
    with the row, instead (`dispatcher.hosts.crosshost`)."""

    task_id: str
    state: State
    cancel_requested: bool
    origin: str

    def to_json(self) -> JSON:
        return {
            "type": "task.noticed",
            "task": {"id": self.task_id, "state": self.state.value, "host": self.origin},
        }


@dataclass(frozen=True, slots=True)
class AccountChanged:
    """A web account or API provider was switched or changed its visible state."""

    name: str
    kind: Kind
    state: AccountState
    previous: AccountState | None  # the state last announced; None the first time
    view: JSON  # what `GET /v1/accounts` answers for it, taken when it changed

    def to_json(self) -> JSON:
        return {
            "type": "account",
            "account": self.view,
            "previous": self.previous.value if self.previous is not None else None,
        }


@dataclass(frozen=True, slots=True)
class ProfilesReloaded:
    """Profiles (and live settings) were read again; `answer` is `POST /v1/reload`'s."""

    answer: JSON

    def to_json(self) -> JSON:
        return {"type": "reload", **self.answer}


@dataclass(frozen=True, slots=True)
class BudgetReached:
    """A provider's daily budget leaves no room for its waiting tasks (issue 30)."""

    provider: str
    spent_usd: float
    limit_usd: float
    until: float  # 00:00 UTC, when it is whole again
    reason: str

    def to_json(self) -> JSON:
        return {
            "type": "budget",
            "provider": self.provider,
            "spent_usd": self.spent_usd,
            "daily_usd": self.limit_usd,
            "until": self.until,
            "reason": self.reason,
        }


Event = TaskChanged | TaskNoticed | AccountChanged | ProfilesReloaded | BudgetReached

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

    @property
    def has_subscribers(self) -> bool:
        return bool(self._subscribers)

    def tell(self, event: Event) -> None:
        """To the listeners alone: an event no stream shows (`TaskNoticed`)."""
        for callback in self._listeners:
            callback(event)

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
