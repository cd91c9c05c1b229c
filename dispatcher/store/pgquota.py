"""A provider's quota known full without asking (PostgreSQL, several hosts).

Every new task wakes every host's scheduler, and each host with a free
lane of its own claimed, though the provider's quota is global and mostly
full: with three hosts, ~0.8 empty claims a task (benchmark 6, issue 31),
each a round trip. A claim under a quota now also answers the ids of the
provider's running tasks (same pipeline: no round trip of its own); when
they fill the quota, this view keeps them, and the provider's claims
answer "nothing" here until one of them stops running, as this host's own
writes and the other hosts' notices tell (`saw`). The view holds only
while the listener is connected (every notice heard: `Listening`), and
for `KEEP_S` of the claims' clock at most: a claim then asks again.

Wrong only one way, briefly: a notice older than the claim that read the
ids can add a task that ended meanwhile, until the notice of its end,
which follows it on the channel, takes it out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from dispatcher.models import State, Task

# How long a full quota is believed without a claim asking (the claims'
# clock, seconds): the scheduler's tick looks again after it anyway.
KEEP_S = 1.0

RUNNING_IDS = "SELECT array_agg(id) AS ids FROM tasks WHERE state = 'running' AND owner = %s"


class Listening(Protocol):
    """Whether the listener hears every notice now, and since which connection."""

    @property
    def live(self) -> bool: ...

    @property
    def connections(self) -> int: ...


@dataclass
class _Full:
    running: set[str]
    seen_at: float
    connection: int


class QuotaView:
    def __init__(self, listening: Listening) -> None:
        self._listening = listening
        self._full: dict[str, _Full] = {}
        self.skipped = 0  # claims answered here, without a round trip

    def skip(self, owner: str, limit: int, now: float) -> bool:
        """True when a claim under this quota would find it full."""
        full = self._full.get(owner)
        if full is None:
            return False
        if (
            not self._listening.live
            or full.connection != self._listening.connections
            or not 0 <= now - full.seen_at < KEEP_S
            or len(full.running) < limit
        ):
            del self._full[owner]
            return False
        self.skipped += 1
        return True

    def claimed(self, owner: str, limit: int, running: list[str] | None, now: float) -> None:
        """What a claim under the quota read: the provider's running tasks."""
        ids = set(running or ())
        if self._listening.live and len(ids) >= limit:
            self._full[owner] = _Full(ids, now, self._listening.connections)
        else:
            self._full.pop(owner, None)

    def saw(self, task: Task) -> None:
        """A task as written (here, or by another host: its notice)."""
        if not self._full:
            return
        if task.state is State.RUNNING:
            full = self._full.get(task.owner or "")
            if full is not None:
                full.running.add(task.id)
            return
        for full in self._full.values():
            full.running.discard(task.id)
