"""In-memory companions of the SQLite backend: write audit and queue positions."""

from __future__ import annotations

import bisect
import sqlite3
from collections.abc import Iterator, Mapping

_PENDING = "pending"


# Task ids per generation of write counts (see WriteCounter).
WRITES_KEPT = 10_000


class WriteCounter(Mapping[str, int]):
    """Rows written per task id, for the tests and benchmarks that audit writes.

    Bounded: a long-running service writes for millions of tasks, and a plain
    Counter kept every id forever. Two generations of plain dicts: ids go to
    the young one (an id written again moves there from the old one), and
    when it holds `generation` ids it becomes the old one, dropping the
    previous old one. So the ids written most recently, at least `generation`
    and at most twice that many, are kept; far more than any audit reads.
    """

    def __init__(self, generation: int = WRITES_KEPT) -> None:
        self.generation = generation
        self._young: dict[str, int] = {}
        self._old: dict[str, int] = {}

    def add(self, task_id: str) -> None:
        young = self._young
        young[task_id] = young.get(task_id, 0) + self._old.pop(task_id, 0) + 1
        if len(young) >= self.generation:
            self._old, self._young = young, {}

    def __getitem__(self, task_id: str) -> int:
        """0 for an id never written (or forgotten), as a Counter would say."""
        return self._young.get(task_id) or self._old.get(task_id, 0)

    def __contains__(self, task_id: object) -> bool:
        return task_id in self._young or task_id in self._old

    def __iter__(self) -> Iterator[str]:
        yield from self._old
        yield from self._young

    def __len__(self) -> int:
        return len(self._young) + len(self._old)


class PendingIndex:
    """Seqs of pending tasks per queue, sorted: a queue position is a bisect."""

    def __init__(self) -> None:
        self._seqs: dict[str, list[int]] = {}

    def add(self, queue: str, seq: int) -> None:
        seqs = self._seqs.setdefault(queue, [])
        if not seqs or seqs[-1] < seq:
            seqs.append(seq)  # a new task: always the newest
        else:
            bisect.insort(seqs, seq)  # a retried or re-queued one keeps its place

    def discard(self, queue: str, seq: int) -> None:
        seqs = self._seqs.get(queue)
        if seqs:
            at = bisect.bisect_left(seqs, seq)
            if at < len(seqs) and seqs[at] == seq:
                del seqs[at]

    def ahead(self, queue: str, seq: int) -> int:
        return bisect.bisect_left(self._seqs.get(queue, ()), seq)

    def counts(self) -> dict[str, int]:
        return {queue: len(seqs) for queue, seqs in self._seqs.items() if seqs}

    def track(self, old_state: str, row: sqlite3.Row) -> None:
        """Follow one task row that was in `old_state` before a write."""
        if old_state == _PENDING and row["state"] != _PENDING:
            self.discard(row["queue"], row["seq"])
        elif old_state != _PENDING and row["state"] == _PENDING:
            self.add(row["queue"], row["seq"])
