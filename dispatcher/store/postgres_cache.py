"""The result cache's index on PostgreSQL: this host's rows only.

Synchronous like every `CacheIndex` (the cache calls it from worker
threads): one plain psycopg connection of its own, opened at first use and
shared by those threads under a lock.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg.rows import dict_row

from dispatcher.errors import StoreError
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
        self._lock = threading.Lock()
        self._conn: psycopg.Connection[dict[str, Any]] | None = None

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

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
