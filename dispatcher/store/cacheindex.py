"""The result cache's index: one `CacheEntry` per fingerprint and host.

Kept apart from `Store` on purpose: the cache does its file work in worker
threads (linking, copying, deleting result files) and reads and writes its
index from those same threads, so this interface is synchronous. Each index
is bound to one host: it sees, touches and deletes only the entries whose
files that host holds; another host's entry is a miss here.
"""

from __future__ import annotations

from typing import Protocol

from dispatcher.models import CacheEntry


class CacheIndex(Protocol):
    # True for an index in a local file (SQLite), whose reads take
    # microseconds: the cache may then answer a miss, or keep a result
    # without files, on the event loop's thread instead of a worker thread's
    # (`ResultCache.miss_here`, `ResultCache.store_text_here`). False for one
    # across the network, which only worker threads may wait for.
    inline: bool

    @property
    def puts_inline(self) -> bool:
        """True when `cache_put` waits for no I/O of the network: a local
        file's upsert, or a put kept in memory for a writer thread. The cache
        may then keep a result without files on the loop's thread
        (`ResultCache.store_text_here`) instead of hopping to a worker."""

    def cache_get(self, fingerprint: str) -> CacheEntry | None: ...

    def known_absent(self, fingerprint: str) -> bool:
        """True when the index knows, without a read and without waiting for
        a lock, that it has no entry for the fingerprint; False when it would
        have to look (then `cache_get` says)."""

    def cache_put(self, entry: CacheEntry) -> None: ...

    def cache_touch(self, fingerprint: str, last_used_at: float) -> None: ...

    def cache_delete(self, fingerprint: str) -> None: ...

    def cache_entries(self) -> list[CacheEntry]: ...
