"""The webhook outbox: deliveries kept in the store, for both dialects.

Kept apart from `Store` (reached as `store.webhook_outbox`): only the
webhooks use it. A row is one event for one receiver. A host takes due rows
with one claiming statement (on PostgreSQL its rows are locked `FOR UPDATE
SKIP LOCKED`, so hosts claiming at once never take the same row) and holds
them until `claimed_until`: a host that dies mid-delivery leaves rows that
another host claims once that passes. Delivery is at least once.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from dispatcher.store.rows import RowLike

PENDING = "pending"
DELIVERING = "delivering"
FAILED = "failed"
STATES = (PENDING, DELIVERING, FAILED)

_COLUMNS = (
    "id, event_id, event, url, body, state, attempts, next_at, claimed_by, "
    "last_status, last_error, created_at, updated_at"
)


@dataclass(frozen=True)
class OutboxItem:
    id: str
    event_id: str
    event: str
    url: str  # the receiver as shown (`webhooks.display_url`): no secrets stored
    body: str
    state: str
    attempts: int
    next_at: float
    claimed_by: str | None = None
    last_status: int | None = None
    last_error: str | None = None
    created_at: float = 0.0
    updated_at: float = 0.0

    def to_json(self) -> dict[str, Any]:
        """The listing's view: everything but the body."""
        return {
            "id": self.id,
            "event": self.event,
            "event_id": self.event_id,
            "url": self.url,
            "state": self.state,
            "attempts": self.attempts,
            "next_at": self.next_at,
            "host": self.claimed_by,
            "last_status": self.last_status,
            "last_error": self.last_error,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
        }


def _item(row: RowLike) -> OutboxItem:
    return OutboxItem(
        id=row["id"],
        event_id=row["event_id"],
        event=row["event"],
        url=row["url"],
        body=row["body"],
        state=row["state"],
        attempts=int(row["attempts"]),
        next_at=float(row["next_at"]),
        claimed_by=row["claimed_by"],
        last_status=row["last_status"],
        last_error=row["last_error"],
        created_at=float(row["created_at"]),
        updated_at=float(row["updated_at"]),
    )


class WebhookOutbox(Protocol):
    async def add(self, items: Sequence[OutboxItem]) -> None:
        """Store new pending deliveries, all or none."""

    async def claim(
        self, url: str, host: str, now: float, hold_until: float, limit: int
    ) -> list[OutboxItem]:
        """Up to `limit` deliveries to `url` due now (pending, or held by a host
        past its `claimed_until`), marked delivering for `host` in one step."""

    async def finish(
        self,
        item_id: str,
        host: str,
        *,
        state: str | None,
        attempts: int,
        next_at: float,
        status: int | None,
        error: str | None,
        now: float,
    ) -> bool:
        """Record an attempt of a delivery `host` holds: `state` None deletes it
        (delivered), else pending (retry at `next_at`) or failed. False when
        the host no longer holds it."""

    async def release(self, host: str, now: float) -> int:
        """Put the host's deliveries under way back to pending (at stop and start)."""

    async def items(self, states: Sequence[str], limit: int) -> list[OutboxItem]:
        """Deliveries in these states, newest first."""

    async def counts(self) -> dict[str, int]:
        """Deliveries per state."""

    async def redeliver(self, item_id: str, now: float) -> OutboxItem | None:
        """A failed delivery pending again, with a fresh budget of attempts;
        None unless it exists and has failed."""

    async def get(self, item_id: str) -> OutboxItem | None: ...

    async def forget_failed(self, updated_before: float) -> int:
        """Delete failed deliveries last tried before then; how many."""


Run = Callable[[str, Sequence[Any]], Awaitable[list[Any]]]
Batch = Callable[[str, Sequence[Sequence[Any]]], Awaitable[None]]


class SqlOutbox:
    """The statements (`?` marks) over the store's own runner of one statement.

    `lock` is "FOR UPDATE SKIP LOCKED" on PostgreSQL and "" on SQLite, where
    the service is the file's only writer.
    """

    def __init__(self, run: Run, batch: Batch, lock: str) -> None:
        self._run = run
        self._batch = batch
        self._lock = lock

    async def add(self, items: Sequence[OutboxItem]) -> None:
        await self._batch(
            "INSERT INTO webhook_outbox (id, event_id, event, url, body, state, attempts, "
            "next_at, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (
                    i.id,
                    i.event_id,
                    i.event,
                    i.url,
                    i.body,
                    PENDING,
                    i.attempts,
                    i.next_at,
                    i.created_at,
                    i.created_at,
                )
                for i in items
            ],
        )

    async def claim(
        self, url: str, host: str, now: float, hold_until: float, limit: int
    ) -> list[OutboxItem]:
        rows = await self._run(
            "UPDATE webhook_outbox SET state = 'delivering', claimed_by = ?, "
            "claimed_until = ?, updated_at = ? WHERE id IN ("
            "SELECT id FROM webhook_outbox WHERE url = ? AND ("
            "(state = 'pending' AND next_at <= ?) "
            "OR (state = 'delivering' AND claimed_until < ?)) "
            f"ORDER BY next_at LIMIT ? {self._lock}) RETURNING {_COLUMNS}",
            (host, hold_until, now, url, now, now, limit),
        )
        return sorted((_item(r) for r in rows), key=lambda i: i.next_at)

    async def finish(
        self,
        item_id: str,
        host: str,
        *,
        state: str | None,
        attempts: int,
        next_at: float,
        status: int | None,
        error: str | None,
        now: float,
    ) -> bool:
        held = "id = ? AND state = 'delivering' AND claimed_by = ?"
        if state is None:
            rows = await self._run(
                f"DELETE FROM webhook_outbox WHERE {held} RETURNING id", (item_id, host)
            )
        else:
            rows = await self._run(
                "UPDATE webhook_outbox SET state = ?, attempts = ?, next_at = ?, "
                "last_status = ?, last_error = ?, claimed_by = NULL, claimed_until = NULL, "
                f"updated_at = ? WHERE {held} RETURNING id",
                (state, attempts, next_at, status, error, now, item_id, host),
            )
        return bool(rows)

    async def release(self, host: str, now: float) -> int:
        rows = await self._run(
            "UPDATE webhook_outbox SET state = 'pending', claimed_by = NULL, "
            "claimed_until = NULL, updated_at = ? "
            "WHERE state = 'delivering' AND claimed_by = ? RETURNING id",
            (now, host),
        )
        return len(rows)

    async def items(self, states: Sequence[str], limit: int) -> list[OutboxItem]:
        marks = ", ".join("?" for _ in states)
        rows = await self._run(
            f"SELECT {_COLUMNS} FROM webhook_outbox WHERE state IN ({marks}) "
            "ORDER BY created_at DESC, id LIMIT ?",
            (*states, limit),
        )
        return [_item(r) for r in rows]

    async def counts(self) -> dict[str, int]:
        rows = await self._run("SELECT state, COUNT(*) AS n FROM webhook_outbox GROUP BY state", ())
        found = {str(r["state"]): int(r["n"]) for r in rows}
        return {state: found.get(state, 0) for state in STATES}

    async def redeliver(self, item_id: str, now: float) -> OutboxItem | None:
        rows = await self._run(
            "UPDATE webhook_outbox SET state = 'pending', attempts = 0, next_at = ?, "
            f"updated_at = ? WHERE id = ? AND state = 'failed' RETURNING {_COLUMNS}",
            (now, now, item_id),
        )
        return _item(rows[0]) if rows else None

    async def get(self, item_id: str) -> OutboxItem | None:
        rows = await self._run(f"SELECT {_COLUMNS} FROM webhook_outbox WHERE id = ?", (item_id,))
        return _item(rows[0]) if rows else None

    async def forget_failed(self, updated_before: float) -> int:
        rows = await self._run(
            "DELETE FROM webhook_outbox WHERE state = 'failed' AND updated_at < ? RETURNING id",
            (updated_before,),
        )
        return len(rows)
