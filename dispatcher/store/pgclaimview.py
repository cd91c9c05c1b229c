"""Claims known to find nothing, answered without asking (PostgreSQL).

Every new task wakes every host's scheduler, and a freed slot claims at
once: with three hosts, ~0.8 claims a task found the provider's global
quota full, and on one host ~0.1-0.2 found no task pending at all
(benchmark 6, issue 31), each a round trip. A claim now also reads, in its
pipeline (no round trip of its own), whether any task is pending anywhere
and, under a quota, the ids of the provider's running tasks. This view
keeps what that says:

- nothing pending: every claim answers "nothing" here until a task is
  seen pending (this host's insert or write, another host's notice);
- a provider's quota full: its claims answer "nothing" here until one of
  those running tasks is seen to stop.

It holds only while the listener is connected (every notice heard, on the
same connection as when the claim read: `Listening`) and for `KEEP_S` of
the claims' clock at most (a retry's `not_before` passing makes no notice:
a claim asks again after it). What is seen while a claim is on its way may
be newer than its read: a task seen pending then voids "nothing pending",
a task seen stopped is taken out of the running tasks it read. Wrong only
one way, briefly: a notice older than the claim's read can add a running
task that ended meanwhile, until the notice of its end, which follows it on
the channel, takes it out.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Protocol

from dispatcher.models import State, Task
from dispatcher.store.hosts import Quota
from dispatcher.store.taskwrites import Statement

# How long a claim's answer is believed without asking (the claims' clock,
# seconds): the scheduler's tick looks again after it anyway.
KEEP_S = 1.0

# Tasks seen stopped, kept for the claims on their way meanwhile.
STOPPED_KEPT = 1024

# What a claim reads besides the task, in its own statement (each statement
# costs ~0.1 ms of our CPU through psycopg): whether another task is still
# pending, and under a quota the provider's running tasks, the claimed one
# included. The statement's snapshot is taken before its claim: the claimed
# row is still pending in it.
_READS = (
    "EXISTS (SELECT 1 FROM tasks WHERE state = 'pending' "
    "AND seq NOT IN (SELECT seq FROM c)) AS after_any, {running} AS after_running"
)
_RUNNING = (
    "ARRAY(SELECT id FROM tasks WHERE state = 'running' AND owner = %s "
    "UNION SELECT id FROM c WHERE owner = %s)"
)


def with_reads(claim: Statement, quota_owner: str | None) -> Statement:
    """The claim (an UPDATE ... RETURNING the task) answering one row always:
    the claimed task's columns (all NULL when none was claimed) and what
    `ClaimView` keeps, as `after_any` and `after_running` (NULL without a quota)."""
    running = "NULL" if quota_owner is None else _RUNNING
    sql = (
        f"WITH c AS ({claim.sql}) SELECT c.*, {_READS.format(running=running)} "
        "FROM (SELECT 1) AS one LEFT JOIN c ON true"
    )
    owners = () if quota_owner is None else (quota_owner, quota_owner)
    return Statement(sql, (*claim.args, *owners))


class Listening(Protocol):
    """Whether the listener hears every notice now, and since which connection."""

    @property
    def live(self) -> bool: ...

    @property
    def connections(self) -> int: ...


@dataclass(frozen=True)
class Sent:
    pending: int
    stopped: int


@dataclass
class _Seen:
    at: float  # the claims' clock
    connection: int


@dataclass
class _Full(_Seen):
    running: set[str]


class ClaimView:
    def __init__(self, listening: Listening) -> None:
        self._listening = listening
        self._empty: _Seen | None = None
        self._full: dict[str, _Full] = {}
        self.skipped = 0  # claims answered here, without a round trip
        # What was seen while a claim was on its way, which its read may
        # predate: tasks pending (then "nothing pending" is not kept), tasks
        # stopped (taken out of the running tasks it read), by number.
        self._pending_seen = 0
        self._stopped_seen = 0
        self._stopped: deque[tuple[int, str]] = deque(maxlen=STOPPED_KEPT)

    def _holds(self, seen: _Seen, now: float) -> bool:
        return (
            self._listening.live
            and seen.connection == self._listening.connections
            and 0 <= now - seen.at < KEEP_S
        )

    def skip(
        self, quota_owner: str | None, limit: int, now: float, *, ending: str | None = None
    ) -> bool:
        """True when the claim would find nothing: nothing pending, or its quota
        full; `ending`: a running task the claim's own transaction ends first
        (its slot counts as free)."""
        if self._empty is not None:
            if self._holds(self._empty, now):
                self.skipped += 1
                return True
            self._empty = None
        if quota_owner is None:
            return False
        full = self._full.get(quota_owner)
        if full is None:
            return False
        if not self._holds(full, now) or len(full.running) < limit:
            del self._full[quota_owner]
            return False
        if ending in full.running and len(full.running) - 1 < limit:
            return False
        self.skipped += 1
        return True

    def nothing_pending(self, now: float) -> bool:
        """True when no task is known pending anywhere (the last claim read
        so, and none was seen pending since)."""
        return self._empty is not None and self._holds(self._empty, now)

    def quota_full(self, owner: str, limit: int, now: float) -> bool:
        """True when the provider's quota is known full (a claim under it
        would find nothing, however many tasks are pending)."""
        full = self._full.get(owner)
        return full is not None and self._holds(full, now) and len(full.running) >= limit

    def sending(self) -> Sent:
        """What was seen when a claim is sent (for `claimed` and `quota_read`)."""
        return Sent(self._pending_seen, self._stopped_seen)

    def claimed(self, any_pending: bool, now: float, sent: Sent) -> None:
        """What a claim read after it: whether any task is pending anywhere."""
        if not any_pending and self._listening.live and self._pending_seen == sent.pending:
            self._empty = _Seen(now, self._listening.connections)

    def read(
        self,
        quota: Quota | None,
        any_pending: bool,
        running: list[str] | None,
        now: float,
        sent: Sent,
    ) -> None:
        """What a claim read after it (`with_reads`): whether any task is
        pending anywhere and, under `quota`, the provider's running tasks."""
        self.claimed(any_pending, now, sent)
        if quota is not None:
            self.quota_read(quota.owner, quota.limit, running, now, sent)

    def quota_read(
        self, owner: str, limit: int, running: list[str] | None, now: float, sent: Sent
    ) -> None:
        """What a claim under the quota read after it: the provider's running tasks."""
        ids = set(running or ())
        if self._stopped_seen > sent.stopped:
            if len(self._stopped) < self._stopped_seen - sent.stopped:
                ids = set()  # more stopped meanwhile than kept: not known
            # Newest last: only the tail seen since the claim was sent.
            for n, task_id in reversed(self._stopped):
                if n <= sent.stopped:
                    break
                ids.discard(task_id)
        if self._listening.live and len(ids) >= limit:
            self._full[owner] = _Full(now, self._listening.connections, ids)
        else:
            self._full.pop(owner, None)

    def saw(self, task: Task) -> None:
        """A task as written (here, or by another host: its notice)."""
        self.noted(task.id, task.state, task.owner)

    def noted(self, task_id: str, state: State, owner: str | None) -> None:
        """A task's write, by what a notice's header says of it."""
        if state is State.PENDING:
            self._pending_seen += 1
            self._empty = None
        if state is not State.RUNNING:
            self._stopped_seen += 1
            self._stopped.append((self._stopped_seen, task_id))
        if not self._full:
            return
        if state is State.RUNNING:
            full = self._full.get(owner or "")
            if full is not None:
                full.running.add(task_id)
            return
        for full in self._full.values():
            full.running.discard(task_id)
