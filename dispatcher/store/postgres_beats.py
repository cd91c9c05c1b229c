"""A host's heartbeats on PostgreSQL: all the beats due at once in one
statement (`store.beats`), instead of a round trip per running task."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dispatcher.models import Task
from dispatcher.store.beats import Heartbeat, heartbeats_statement
from dispatcher.store.pgclaimview import ClaimView
from dispatcher.store.rows import row_to_task


class PostgresBeatOps:
    claim_view: ClaimView

    async def _write1(
        self, sql: str, args: Sequence[Any] = (), *, marked: bool = False
    ) -> list[dict[str, Any]]:
        raise NotImplementedError

    async def heartbeat_tasks(self, beats: Sequence[Heartbeat]) -> list[Task | None]:
        if not beats:
            return []
        statement = heartbeats_statement(beats)
        rows = await self._write1(statement.sql, statement.args, marked=True)
        # By attempt too: a beat of an attempt that ended gets no row.
        written = {(task.id, task.attempt): task for task in map(row_to_task, rows)}
        for task in written.values():
            self.claim_view.saw(task)
        return [written.get((beat.task_id, beat.attempt)) for beat in beats]
