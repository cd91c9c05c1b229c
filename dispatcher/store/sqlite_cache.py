"""The result cache's index on the SQLite file (see `store.cacheindex`).

It shares the store's connection and lock: the cache calls it from worker
threads, the store from the event loop's thread.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Sequence
from typing import Any

from dispatcher.errors import StoreError
from dispatcher.models import CacheEntry
from dispatcher.store.rows import row_to_cache_entry


class SqliteCacheIndex:
    def __init__(self, db: sqlite3.Connection, lock: threading.RLock) -> None:
        self._db = db
        self._lock = lock

    def _query(self, sql: str, args: Sequence[Any] = ()) -> list[sqlite3.Row]:
        with self._lock:
            try:
                return self._db.execute(sql, args).fetchall()
            except sqlite3.Error as exc:
                raise StoreError(f"SQLite cache index access failed: {exc}") from exc

    def cache_get(self, fingerprint: str) -> CacheEntry | None:
        rows = self._query("SELECT * FROM cache_entries WHERE fingerprint = ?", (fingerprint,))
        return row_to_cache_entry(rows[0]) if rows else None

    def cache_put(self, entry: CacheEntry) -> None:
        self._query(
            "INSERT INTO cache_entries (fingerprint, model, result, size_bytes, created_at, "
            "last_used_at) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (fingerprint) DO UPDATE SET "
            "model = excluded.model, result = excluded.result, "
            "size_bytes = excluded.size_bytes, created_at = excluded.created_at, "
            "last_used_at = excluded.last_used_at",
            (
                entry.fingerprint,
                entry.model,
                json.dumps(entry.result),
                entry.size_bytes,
                entry.created_at,
                entry.last_used_at,
            ),
        )

    def cache_touch(self, fingerprint: str, last_used_at: float) -> None:
        self._query(
            "UPDATE cache_entries SET last_used_at = ? WHERE fingerprint = ?",
            (last_used_at, fingerprint),
        )

    def cache_delete(self, fingerprint: str) -> None:
        self._query("DELETE FROM cache_entries WHERE fingerprint = ?", (fingerprint,))

    def cache_entries(self) -> list[CacheEntry]:
        return [
            row_to_cache_entry(r)
            for r in self._query("SELECT * FROM cache_entries ORDER BY last_used_at")
        ]
