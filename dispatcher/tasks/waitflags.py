"""Whether a claim must look for fallbacks or sort its queues (issue 30),
known in memory on one host instead of asked of the store before every claim.

A claim looks among the tasks waiting in its queues as a fallback only while
such a task waits, and sorts a queue by priority and deadline only while a
task of it has one; otherwise it serves plain FIFO from the queue index.
Asking the store both before each claim cost about 5 % of dispatch
throughput. On one host (SQLite: the only writer) every task that becomes
pending is announced by the ledger, so once the store has answered "none"
the answer holds until such a task is seen: until then the claim does not
ask again. With several hosts (PostgreSQL) another host may insert at any
moment and a notice can be lost while the listener reconnects: the claim
statement itself looks (`claim_sql_gated`), and the ledger does not ask.
"""

from __future__ import annotations

from collections.abc import Sequence

from dispatcher.models import State, Task


class WaitFlags:
    """What a claim must look for: False when known absent, None: ask the store."""

    def __init__(self, *, shared: bool) -> None:
        self.shared = shared
        self._no_fallbacks = False  # the store said none wait (unknown at start)
        self._unranked: set[str] = set()  # queues the store said hold no ranked task

    def seen(self, task: Task) -> None:
        """A task the ledger wrote: a pending one may need looking for."""
        if task.state is not State.PENDING:
            return
        if task.alt_queues:
            self._no_fallbacks = False
        if task.priority != 0 or task.deadline is not None:
            self._unranked.discard(task.queue)

    def fallbacks(self) -> bool | None:
        return False if self._no_fallbacks and not self.shared else None

    def ranked(self, queues: Sequence[str]) -> bool | None:
        known = not self.shared and all(queue in self._unranked for queue in queues)
        return False if known else None

    def answered(self, *, fallbacks: bool | None = None, ranked: Sequence[str] = ()) -> None:
        """What the store said: whether fallbacks wait; `ranked`, queues it said
        hold no ranked task (asked and answered with no await between, on the
        one writer, so nothing slipped in)."""
        if fallbacks is not None:
            self._no_fallbacks = not fallbacks
        self._unranked.update(ranked)
