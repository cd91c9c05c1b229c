"""The result cache's index on PostgreSQL: this host's rows only.

Synchronous like every `CacheIndex` (the cache calls it from worker
threads): one plain psycopg connection of its own, opened at first use and
shared by those threads under a lock.

Only this host writes its rows, so the index keeps their fingerprints in
memory (read once, at first use, then kept with each put and delete): a
miss, nearly every new task, is then known without a round trip.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg.rows import dict_row

from dispatcher.errors import StoreError
from dispatcher.models import CacheEntry
from dispatcher.store.cachesql import SqlCacheIndex
from dispatcher.store.pgtrips import RoundTrips, statement_label
from dispatcher.store.rows import RowLike
from dispatcher.store.sql import pg_marks

CONNECT_TIMEOUT_S = 10


class PostgresCacheIndex(SqlCacheIndex):
    def __init__(self, url: str, host: str, trips: RoundTrips | None = None) -> None:
        super().__init__(host, scoped=True)
        self._url = url
        self._trips = trips
        self._lock = threading.RLock()
        self._conn: psycopg.Connection[dict[str, Any]] | None = None
        # This host's fingerprints (None until first read; under `_lock`).
        self._held: set[str] | None = None

    def _run(self, sql: str, args: Sequence[Any] = ()) -> list[RowLike]:
        with self._lock:
            try:
                if self._conn is None or self._conn.closed:
                    self._conn = psycopg.connect(
                        self._url,
                        autocommit=True,
                        row_factory=dict_row,
                        connect_timeout=CONNECT_TIMEOUT_S,
                    )
                if self._trips is not None:
                    self._trips.add("cache index: " + statement_label(sql))
                cur = self._conn.execute(pg_marks(sql), args)
                return list(cur.fetchall()) if cur.description else []
            except psycopg.Error as exc:
                raise StoreError(f"PostgreSQL cache index access failed: {exc}") from exc

    def _fingerprints(self) -> set[str]:
        if self._held is None:
            rows = self._run("SELECT fingerprint FROM cache_entries WHERE host = ?", (self._host,))
            self._held = {str(r["fingerprint"]) for r in rows}
        return self._held

    def known_absent(self, fingerprint: str) -> bool:
        # Never waits: a worker thread may hold the lock for a round trip.
        if not self._lock.acquire(blocking=False):
            return False
        try:
            return self._held is not None and fingerprint not in self._held
        finally:
            self._lock.release()

    def cache_get(self, fingerprint: str) -> CacheEntry | None:
        with self._lock:
            if fingerprint not in self._fingerprints():
                return None
        return super().cache_get(fingerprint)

    def cache_put(self, entry: CacheEntry) -> None:
        super().cache_put(entry)
        with self._lock:
            self._fingerprints().add(entry.fingerprint)

    def cache_delete(self, fingerprint: str) -> None:
        super().cache_delete(fingerprint)
        with self._lock:
            self._fingerprints().discard(fingerprint)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
            self._held = None
