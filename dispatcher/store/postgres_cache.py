"""The result cache's index on PostgreSQL: this host's rows only.

Synchronous like every `CacheIndex` (the cache calls it from worker
threads, and puts from the loop's thread once they touch only memory:
`puts_inline`): one plain psycopg connection of its own, opened at first
use and shared by those threads under a lock.

Only this host reads and writes its rows, so the index keeps what it needs
in memory:

- the fingerprints it holds (read once, at first use, then kept with each
  put and delete): a miss, nearly every new task, is known without a round
  trip;
- the entries put but not written yet. A put was a round trip per task
  (issue 31); a writer thread now writes the puts of `FLUSH_S` together, one
  round trip (a pipeline), and the index answers them from memory meanwhile.
  A crash loses at most those entries (half a second's): later misses, and their files, not
  listed by the index, are deleted at the next start (as for a crash between
  a result's files and its row).

Two locks: `_lock` for the memory (never held across a round trip, so
`known_absent` does not wait), `_io` for the connection (taken first when
both are needed).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg.rows import dict_row

from dispatcher.errors import StoreError
from dispatcher.models import CacheEntry
from dispatcher.store.cachesql import CACHE_COLUMNS, PUT_ON_CONFLICT, PendingPutsIndex
from dispatcher.store.pgtrips import RoundTrips, has_rows, statement_label
from dispatcher.store.rows import RowLike
from dispatcher.store.sql import pg_marks

log = logging.getLogger("dispatcher.store.cache")

CONNECT_TIMEOUT_S = 10
# How long a put waits for others to share its round trip (real seconds):
# at 100 results a second, fifty a round trip; sooner once `FLUSH_AT` wait.
FLUSH_S = 0.5
FLUSH_AT = 64
# The Python type of each of `PUT_MANY`'s arrays, in `CACHE_COLUMNS`' order.
_ARRAY_KINDS: tuple[type, ...] = (str, str, str, int, float, float)
# A batch of puts as one statement: each column an array, the rows unnested
# on the server. `executemany` sent a statement per entry through psycopg,
# in the writer thread, holding the GIL the loop needs: one host's CPU per
# instant task 4.31 -> 4.02 ms (eight paired rounds, 2026-12-06). A
# fingerprint is once in a batch (the pending puts are keyed by it), as ON
# CONFLICT DO UPDATE requires.
PUT_MANY = (
    f"INSERT INTO cache_entries (host, {CACHE_COLUMNS}) "
    "SELECT %s, * FROM unnest("
    "%s::text[], %s::text[], %s::text[], %s::bigint[], %s::float8[], %s::float8[]) "
    f"{PUT_ON_CONFLICT}"
)


class PostgresCacheIndex(PendingPutsIndex):
    def __init__(self, url: str, host: str, trips: RoundTrips | None = None) -> None:
        super().__init__(host, scoped=True)
        self._url = url
        self._trips = trips
        self._lock = threading.Lock()
        self._io = threading.Lock()
        self._conn: psycopg.Connection[dict[str, Any]] | None = None
        # This host's fingerprints (None until first read; under `_lock`).
        self._held: set[str] | None = None
        # Entries put, not written yet (under `_lock`).
        self._pending: dict[str, CacheEntry] = {}
        self._due = threading.Condition(self._lock)
        self._writer: threading.Thread | None = None
        self._closing = False

    def _connection(self) -> psycopg.Connection[dict[str, Any]]:
        """The index's connection (`_io` held)."""
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(
                self._url,
                autocommit=True,
                row_factory=dict_row,
                connect_timeout=CONNECT_TIMEOUT_S,
            )
        return self._conn

    def _count(self, sql: str) -> None:
        if self._trips is not None:
            self._trips.add("cache index: " + statement_label(sql))

    def _run(self, sql: str, args: Sequence[Any] = ()) -> list[RowLike]:
        with self._io:
            try:
                conn = self._connection()
                self._count(sql)
                cur = conn.execute(pg_marks(sql), args)
                return list(cur.fetchall()) if has_rows(cur) else []
            except psycopg.Error as exc:
                raise StoreError(f"PostgreSQL cache index access failed: {exc}") from exc

    def _fingerprints(self) -> set[str]:
        """This host's fingerprints, read at first use (never under `_lock`)."""
        held = self._held
        if held is None:
            rows = self._run("SELECT fingerprint FROM cache_entries WHERE host = ?", (self._host,))
            with self._lock:
                if self._held is None:
                    self._held = {str(r["fingerprint"]) for r in rows} | set(self._pending)
                held = self._held
        return held

    @property
    def puts_inline(self) -> bool:
        # Once this host's fingerprints are read, a put is kept in memory and
        # written by the writer thread: the loop's thread may make it.
        return self._held is not None

    def known_absent(self, fingerprint: str) -> bool:
        # Never waits: a put or a delete may hold the lock for an instant.
        if not self._lock.acquire(blocking=False):
            return False
        try:
            return self._held is not None and fingerprint not in self._held
        finally:
            self._lock.release()

    def cache_get(self, fingerprint: str) -> CacheEntry | None:
        held = self._fingerprints()
        with self._lock:
            if fingerprint not in held:
                return None
            pending = self._pending.get(fingerprint)
        if pending is not None:
            return pending
        return super().cache_get(fingerprint)

    def cache_put(self, entry: CacheEntry) -> None:
        """Kept at once (later reads see it); written with the others of
        `FLUSH_S` by the writer thread."""
        held = self._fingerprints()
        with self._lock:
            held.add(entry.fingerprint)
            self._pending[entry.fingerprint] = entry
            if self._writer is None:
                self._writer = threading.Thread(
                    target=self._write_due, name="pg-cache-writer", daemon=True
                )
                self._writer.start()
            # Woken only when it has something to do: the first put of a
            # batch, or a batch full. A wake-up per put cost each task a
            # thread switch for a check that the timed wait makes anyway.
            if len(self._pending) in (1, FLUSH_AT):
                self._due.notify()

    def cache_delete(self, fingerprint: str) -> None:
        # Out of memory first: a write in flight holds `_io`, so the delete
        # below runs after it and the row does not come back.
        held = self._fingerprints()
        with self._lock:
            self._pending.pop(fingerprint, None)
            held.discard(fingerprint)
        super().cache_delete(fingerprint)

    def cache_entries(self) -> list[CacheEntry]:
        self.flush()
        return super().cache_entries()

    def flush(self) -> None:
        """Write the entries put so far: one statement for all of them."""
        with self._io:
            with self._lock:
                batch = list(self._pending.values())
            if not batch:
                return
            try:
                conn = self._connection()
                self._count(PUT_MANY)
                conn.execute(PUT_MANY, self._put_many_args(batch))
            except psycopg.Error as exc:
                # Dropped, not retried: a cache entry lost is a later miss.
                log.warning("cache: %d entries not written to PostgreSQL: %s", len(batch), exc)
            with self._lock:
                for entry in batch:
                    # A newer put (or use) of the same fingerprint stays due.
                    if self._pending.get(entry.fingerprint) is entry:
                        del self._pending[entry.fingerprint]

    def _put_many_args(self, batch: Sequence[CacheEntry]) -> tuple[Any, ...]:
        """`PUT_MANY`'s arguments: the host, then each column's values (a row's
        `_put_args` but its host), typed as its array is: a list mixing ints
        and floats is not one array type."""
        columns = zip(*(self._put_args(entry)[1:] for entry in batch), strict=True)
        typed = zip(_ARRAY_KINDS, columns, strict=True)
        return (self._host, *([kind(v) for v in values] for kind, values in typed))

    def _write_due(self) -> None:
        while True:
            with self._lock:
                self._due.wait_for(lambda: bool(self._pending) or self._closing)
                if self._closing:
                    return
                # The puts of the next FLUSH_S share this one's round trip.
                self._due.wait_for(
                    lambda: self._closing or len(self._pending) >= FLUSH_AT, timeout=FLUSH_S
                )
            self.flush()

    def close(self) -> None:
        with self._lock:
            writer, self._writer = self._writer, None
            self._closing = True
            self._due.notify_all()
        if writer is not None:
            writer.join()
        self.flush()
        with self._io, self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
            self._held = None
            self._closing = False
