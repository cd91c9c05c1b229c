"""The result cache's index in SQL (see `store.cacheindex`), for both dialects.

Every row records the host holding its files. On PostgreSQL an index sees
only its own host's rows (`scoped`): another host's file is not on this
disk, so its entry is a miss here and never deleted from here. A SQLite
file serves one host, so its index sees every row.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Sequence
from typing import Any

from dispatcher.errors import StoreError
from dispatcher.models import CacheEntry
from dispatcher.store.rows import RowLike, row_to_cache_entry

_COLUMNS = "fingerprint, model, result, size_bytes, created_at, last_used_at"
# An entry put, replacing an older one of its fingerprint and host.
PUT = (
    f"INSERT INTO cache_entries (host, {_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (fingerprint, host) DO UPDATE SET "
    "model = excluded.model, result = excluded.result, "
    "size_bytes = excluded.size_bytes, created_at = excluded.created_at, "
    "last_used_at = excluded.last_used_at"
)


class SqlCacheIndex:
    """The statements; `_run` executes one with `?` marks."""

    inline = False

    @property
    def puts_inline(self) -> bool:
        return self.inline

    def __init__(self, host: str, *, scoped: bool) -> None:
        self._host = host
        self._scope = " AND host = ?" if scoped else ""
        self._scope_args: tuple[str, ...] = (host,) if scoped else ()

    def _run(self, sql: str, args: Sequence[Any] = ()) -> list[RowLike]:
        raise NotImplementedError

    def cache_get(self, fingerprint: str) -> CacheEntry | None:
        rows = self._run(
            f"SELECT {_COLUMNS} FROM cache_entries WHERE fingerprint = ?{self._scope}",
            (fingerprint, *self._scope_args),
        )
        return row_to_cache_entry(rows[0]) if rows else None

    def known_absent(self, fingerprint: str) -> bool:
        return False  # a read says (SQLite's is inline: `ResultCache.miss_here`)

    def cache_put(self, entry: CacheEntry) -> None:
        self._run(PUT, self._put_args(entry))

    def _put_args(self, entry: CacheEntry) -> tuple[Any, ...]:
        return (
            self._host,
            entry.fingerprint,
            entry.model,
            json.dumps(entry.result),
            entry.size_bytes,
            entry.created_at,
            entry.last_used_at,
        )

    def cache_touch(self, fingerprint: str, last_used_at: float) -> None:
        self._run(
            f"UPDATE cache_entries SET last_used_at = ? WHERE fingerprint = ?{self._scope}",
            (last_used_at, fingerprint, *self._scope_args),
        )

    def cache_delete(self, fingerprint: str) -> None:
        self._run(
            f"DELETE FROM cache_entries WHERE fingerprint = ?{self._scope}",
            (fingerprint, *self._scope_args),
        )

    def cache_entries(self) -> list[CacheEntry]:
        where = " WHERE host = ?" if self._scope else ""
        rows = self._run(
            f"SELECT {_COLUMNS} FROM cache_entries{where} ORDER BY last_used_at",
            self._scope_args,
        )
        return [row_to_cache_entry(r) for r in rows]


class SqliteCacheIndex(SqlCacheIndex):
    """Shares the store's connection and lock: the cache calls it from worker
    threads, the store from the event loop's thread."""

    inline = True  # the store's own file: as quick as the store's reads

    def __init__(self, db: sqlite3.Connection, lock: threading.RLock, host: str) -> None:
        super().__init__(host, scoped=False)
        self._db = db
        self._lock = lock

    def _run(self, sql: str, args: Sequence[Any] = ()) -> list[RowLike]:
        with self._lock:
            try:
                return list(self._db.execute(sql, args).fetchall())
            except sqlite3.Error as exc:
                raise StoreError(f"SQLite cache index access failed: {exc}") from exc
