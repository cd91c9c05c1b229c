"""The result cache's index in SQL (see `store.cacheindex`), for both dialects.

Every row records the host holding its files. On PostgreSQL an index sees
only its own host's rows (`scoped`): another host's file is not on this
disk, so its entry is a miss here and never deleted from here. A SQLite
file serves one host, so its index sees every row.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import sqlite3
import threading
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

from dispatcher.errors import StoreError
from dispatcher.models import CacheEntry
from dispatcher.store.rows import RowLike, row_to_cache_entry

log = logging.getLogger("dispatcher.store.cache")

# An entry's columns but its host, in the order `_put_args` gives their values.
CACHE_COLUMNS = "fingerprint, model, result, size_bytes, created_at, last_used_at"
# An entry put replaces an older one of its fingerprint and host.
PUT_ON_CONFLICT = (
    "ON CONFLICT (fingerprint, host) DO UPDATE SET "
    "model = excluded.model, result = excluded.result, "
    "size_bytes = excluded.size_bytes, created_at = excluded.created_at, "
    "last_used_at = excluded.last_used_at"
)
PUT = (
    f"INSERT INTO cache_entries (host, {CACHE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?) "
    + PUT_ON_CONFLICT
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
            f"SELECT {CACHE_COLUMNS} FROM cache_entries WHERE fingerprint = ?{self._scope}",
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
            f"SELECT {CACHE_COLUMNS} FROM cache_entries{where} ORDER BY last_used_at",
            self._scope_args,
        )
        return [row_to_cache_entry(r) for r in rows]


class PendingPutsIndex(SqlCacheIndex):
    """An index whose puts wait in memory (`_pending`, under `_lock`) until
    written with others: answered from there meanwhile."""

    _lock: threading.Lock | threading.RLock
    _pending: dict[str, CacheEntry]

    def cache_touch(self, fingerprint: str, last_used_at: float) -> None:
        with self._lock:
            entry = self._pending.get(fingerprint)
            if entry is not None:
                # Not written yet: written with its new use.
                self._pending[fingerprint] = dataclasses.replace(entry, last_used_at=last_used_at)
                return
        super().cache_touch(fingerprint, last_used_at)


class SqliteCacheIndex(PendingPutsIndex):
    """Shares the store's connection and lock: the cache calls it from worker
    threads, the store from the event loop's thread.

    A put made on the loop's thread (a result without files, nearly every
    task's) is not a commit of its own: it is kept in memory, answered from
    there, and written inside the store's next write transaction
    (`ride`), which the next task's end makes within milliseconds on a busy
    host. Its own commit cost each task ~40 us of ~1.3 ms (issue 31's batch).
    A quiet host writes it within `FLUSH_S` (`flush`, from the loop's
    timer). A crash loses at most those entries: later misses, as on
    PostgreSQL (`store.postgres_cache`). A worker thread's put (a result
    with files) is written at once, as before.
    """

    inline = True  # the store's own file: as quick as the store's reads

    # Longest a put waits for a store write to carry it (real seconds).
    FLUSH_S = 0.5

    def __init__(
        self,
        db: sqlite3.Connection,
        lock: threading.RLock,
        host: str,
        transaction: Callable[[], AbstractContextManager[sqlite3.Connection]],
    ) -> None:
        super().__init__(host, scoped=False)
        self._db = db
        self._lock = lock
        # The store's write transaction, which carries the pending puts (`ride`).
        self._transaction = transaction
        # Entries put on the loop's thread, not written yet (under `_lock`).
        self._pending: dict[str, CacheEntry] = {}
        self._flush_due: asyncio.TimerHandle | None = None

    def _run(self, sql: str, args: Sequence[Any] = ()) -> list[RowLike]:
        with self._lock:
            try:
                return list(self._db.execute(sql, args).fetchall())
            except sqlite3.Error as exc:
                raise StoreError(f"SQLite cache index access failed: {exc}") from exc

    def cache_put(self, entry: CacheEntry) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # a worker thread's: no loop to flush it later
            with self._lock:
                # An older put still pending must not be written over this one.
                self._pending.pop(entry.fingerprint, None)
                super().cache_put(entry)
            return
        with self._lock:
            self._pending[entry.fingerprint] = entry
            if self._flush_due is None:
                self._flush_due = loop.call_later(self.FLUSH_S, self._flush_later)

    def cache_get(self, fingerprint: str) -> CacheEntry | None:
        with self._lock:
            pending = self._pending.get(fingerprint)
        return pending if pending is not None else super().cache_get(fingerprint)

    def cache_delete(self, fingerprint: str) -> None:
        with self._lock:
            self._pending.pop(fingerprint, None)
            super().cache_delete(fingerprint)

    def cache_entries(self) -> list[CacheEntry]:
        with self._lock:
            self.flush()
            return super().cache_entries()

    def ride(self, db: sqlite3.Connection) -> list[CacheEntry]:
        """Write the pending puts inside the caller's transaction (the store's
        lock held); the caller calls `written` with them once it committed.
        A put that fails is dropped here (a later miss), never failing the
        transaction that carried it."""
        puts = list(self._pending.values())
        if puts:
            try:
                db.executemany(PUT, [self._put_args(entry) for entry in puts])
            except (sqlite3.Error, TypeError, ValueError) as exc:
                log.warning("cache: %d entries not written to SQLite: %s", len(puts), exc)
        return puts

    def written(self, puts: Sequence[CacheEntry]) -> None:
        for entry in puts:
            # A newer put (or use) of the same fingerprint stays due.
            if self._pending.get(entry.fingerprint) is entry:
                del self._pending[entry.fingerprint]

    def flush(self) -> None:
        """Write the pending puts in a store transaction of their own (one
        with nothing else to write: `ride` carries them)."""
        with self._lock:
            if self._pending:
                with self._transaction():
                    pass

    def _flush_later(self) -> None:
        with self._lock:
            self._flush_due = None
            try:
                self.flush()
            except StoreError as exc:  # a timer has no caller to tell: the entries wait
                log.warning("%s; retried at the next write", exc)

    def close(self) -> None:
        """Write what is pending (the store is closing its connection)."""
        with self._lock:
            if self._flush_due is not None:
                self._flush_due.cancel()
                self._flush_due = None
            self.flush()
