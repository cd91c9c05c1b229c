"""The result cache: successful results kept under their task fingerprint.

Files live on disk in ``<directory>/<fingerprint>/<index>-<name>``; the index
(one `CacheEntry` per fingerprint) lives in the store, never only in memory,
so the cache survives restarts and the disk and the index are reconciled at
start-up: files the index does not know are deleted, rows whose files are
gone are dropped.

Expiry and eviction (`plan_eviction` decides, `ResultCache` applies):

* **TTL counts from creation**, not from last use. A result that is hit
  every day would otherwise live forever, while the model behind a stable
  name keeps changing; after the TTL a fresh generation is due.
* Under the byte cap, the **least recently used** entries go first.

Eviction runs at start-up and after each write. A write that fails on disk is
logged and skipped: a cache problem must never fail a task that succeeded.

Paths inside stored results are rebuilt from `directory` on every read, so a
state dir that moved keeps its cache.

Several hosts on one PostgreSQL database: each host's cache is its own
directory, and its index sees only the entries whose files that host holds
(`store.cacheindex`). Another host's entry is a **miss** here, by choice:
fetching its files through that host would need hosts to reach each other,
and running the task again costs one generation, after which this host has
its own copy. So start-up reconciliation and eviction only ever drop this
host's own entries. (A shared results dir does not change this: the cache
lives in each host's state dir.)
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
import os
import re
import shutil
import threading
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dispatcher.clock import Clock
from dispatcher.models import JSON, CacheEntry
from dispatcher.store.cacheindex import CacheIndex
from dispatcher.tasks.fingerprint import canonical_json

log = logging.getLogger("dispatcher.tasks.cache")

# A fingerprint names a directory: refuse anything that could step outside.
_FINGERPRINT = re.compile(r"[A-Za-z0-9_-]{1,128}")
_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")
_MAX_NAME_CHARS = 100
_TMP_PREFIX = ".tmp-"


# -- the pure decision ---------------------------------------------------------


def is_expired(entry: CacheEntry, now: float, ttl_s: float) -> bool:
    """True once the entry is `ttl_s` old, counted from its creation."""
    return now - entry.created_at >= ttl_s


@dataclass(frozen=True)
class EvictionPlan:
    expired: tuple[str, ...] = ()  # older than the TTL
    over_cap: tuple[str, ...] = ()  # least recently used, dropped to get under the cap
    kept_bytes: int = 0  # what the cache holds once the plan is applied

    @property
    def fingerprints(self) -> tuple[str, ...]:
        return self.expired + self.over_cap

    def __bool__(self) -> bool:
        return bool(self.expired or self.over_cap)


def plan_eviction(
    entries: Iterable[CacheEntry], now: float, max_bytes: int, ttl_s: float
) -> EvictionPlan:
    """Which entries to drop: every expired one, then the least recently used
    live ones until the rest fits in `max_bytes`. Nothing more than that."""
    expired: list[str] = []
    live: list[CacheEntry] = []
    for entry in entries:
        if is_expired(entry, now, ttl_s):
            expired.append(entry.fingerprint)
        else:
            live.append(entry)
    # created_at and the fingerprint break ties so the plan is deterministic.
    live.sort(key=lambda e: (e.last_used_at, e.created_at, e.fingerprint))
    total = sum(e.size_bytes for e in live)
    over_cap: list[str] = []
    for entry in live:
        if total <= max_bytes:
            break
        over_cap.append(entry.fingerprint)
        total -= entry.size_bytes
    return EvictionPlan(expired=tuple(sorted(expired)), over_cap=tuple(over_cap), kept_bytes=total)


# -- files -----------------------------------------------------------------------


def _safe_name(index: int, name: str) -> str:
    """``<index>-<name>``: the index keeps two files of the same name apart."""
    base = _UNSAFE_NAME.sub("_", Path(name).name).lstrip(".") or "file"
    return f"{index}-{base[-_MAX_NAME_CHARS:]}"


def _link_or_copy(src: Path, dst: Path) -> None:
    """A hard link when possible (no second copy of a video), else a real copy.

    Result files are written once and never modified in place, so sharing an
    inode with the task's own copy is safe; deleting either name leaves the
    other intact.
    """
    try:
        os.link(src, dst)
    except OSError:
        # EXDEV (another filesystem), EPERM (protected_hardlinks), or a
        # filesystem without links: copy instead.
        shutil.copyfile(src, dst)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


class ResultCache:
    """Result files on disk, indexed in the store. Thread-safe."""

    def __init__(
        self,
        store: CacheIndex,
        directory: Path,
        clock: Clock,
        max_bytes: int,
        ttl_s: float,
    ) -> None:
        if max_bytes < 0:
            raise ValueError("max_bytes must not be negative")
        if ttl_s <= 0:
            raise ValueError("ttl_s must be positive")
        self.store = store
        self.directory = directory
        self.clock = clock
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        # Counters for metrics; only ever increase.
        self.hits = 0
        self.misses = 0
        self.stored = 0
        self.evicted_expired = 0
        self.evicted_lru = 0
        self.dropped_missing = 0  # rows dropped because their files were gone
        # Running totals of what the index holds; exact after each full plan.
        self._held_bytes = 0
        self._oldest_created_at = math.inf
        # One lock for index and files together: a lookup must never see a
        # row whose directory an eviction is halfway through deleting.
        self._lock = threading.RLock()

    # -- public ------------------------------------------------------------

    def startup(self) -> EvictionPlan:
        """Reconcile disk and index, then evict. Call once before serving."""
        with self._lock:
            self.directory.mkdir(parents=True, exist_ok=True)
            known: dict[str, set[str]] = {}
            for entry in self.store.cache_entries():
                if not _FINGERPRINT.fullmatch(entry.fingerprint):
                    log.warning("cache: dropping index row with bad key %r", entry.fingerprint)
                    self.store.cache_delete(entry.fingerprint)
                    continue
                if self._resolve(entry) is None:
                    log.info("cache: dropping %s, its files are gone", entry.fingerprint)
                    self._drop(entry.fingerprint)
                    self.dropped_missing += 1
                    continue
                known[entry.fingerprint] = {Path(f["path"]).name for f in _files(entry.result)}
            self._delete_unindexed(known)
            return self._evict()

    def lookup(self, fingerprint: str, *, copy_to: Path | None = None) -> JSON | None:
        """The cached result (file paths valid on disk) or None; a hit counts as a use.

        Paths point into the cache directory, where eviction may later delete
        them; pass `copy_to` (the task's own result dir) to get paths there
        instead, which outlive the cache entry.
        """
        with self._lock:
            valid = _FINGERPRINT.fullmatch(fingerprint) is not None
            entry = self.store.cache_get(fingerprint) if valid else None
            if entry is None:
                self.misses += 1
                return None
            now = self.clock.now()
            if is_expired(entry, now, self.ttl_s):
                self._drop(fingerprint)
                self.evicted_expired += 1
                self.misses += 1
                return None
            result = self._resolve(entry)
            if result is None:
                log.warning("cache: %s lost its files; dropping it", fingerprint)
                self._drop(fingerprint)
                self.dropped_missing += 1
                self.misses += 1
                return None
            if copy_to is not None:
                try:
                    result = self._copy_out(result, copy_to)
                except OSError as exc:
                    log.warning("cache: cannot copy %s to %s: %s", fingerprint, copy_to, exc)
                    self.misses += 1
                    return None
            self.store.cache_touch(fingerprint, now)
            self.hits += 1
            return result

    def has(self, fingerprint: str) -> bool:
        """Whether `lookup` would likely answer (an unexpired entry), without
        counting it or touching any file: what a plan counts as cached."""
        if _FINGERPRINT.fullmatch(fingerprint) is None:
            return False
        with self._lock:
            entry = self.store.cache_get(fingerprint)
        return entry is not None and not is_expired(entry, self.clock.now(), self.ttl_s)

    def miss_here(self, fingerprint: str) -> bool:
        """True (and counted) when `lookup` would find nothing: answered on the
        caller's thread, without the hop to a worker thread `lookup` needs.

        Nearly every new task misses, and a miss is one indexed read of a
        local index with no file work: the hop to a worker thread and back
        cost more than the read (BENCHMARKS.md, finding 2). False means "ask
        `lookup`": the index is across the network and cannot tell without a
        read (`CacheIndex.known_absent`), or holds the fingerprint
        (a hit, or an expired entry to delete, is file work), or a thread
        holds the lock (an eviction deleting files: never waited for here).
        """
        if not self.store.inline:
            # An index across the network may know a miss without a read
            # (PostgreSQL's keeps this host's fingerprints in memory).
            if _FINGERPRINT.fullmatch(fingerprint) and not self.store.known_absent(fingerprint):
                return False
            self.misses += 1
            return True
        if not self._lock.acquire(blocking=False):
            return False
        try:
            if _FINGERPRINT.fullmatch(fingerprint) and self.store.cache_get(fingerprint):
                return False
            self.misses += 1
            return True
        finally:
            self._lock.release()

    def store_text_here(self, fingerprint: str, model: str, result: Mapping[str, Any]) -> bool:
        """True when `store_result` was done on the caller's thread: a result
        without files, nothing on disk to replace, no eviction due. False means
        "call `store_result`" (in a worker thread), which does the same plus
        the file work; see `miss_here` for why and when it declines.
        """
        if (
            not self.store.puts_inline
            or result.get("files")
            or not _FINGERPRINT.fullmatch(fingerprint)
            or not self._lock.acquire(blocking=False)
        ):
            return False
        try:
            try:
                cached, size = _text_entry(result)
            except (TypeError, ValueError):
                return False  # `store_result` logs why
            # An older entry's folder to delete, or an eviction after the
            # put, is file work (a stat of a local directory is not).
            now = self.clock.now()
            if self._eviction_possible(now, adding=size) or os.path.lexists(
                self.directory / fingerprint
            ):
                return False
            self._put(fingerprint, model, cached, size, now)
            return True
        finally:
            self._lock.release()

    def store_result(self, fingerprint: str, model: str, result: Mapping[str, Any]) -> None:
        """Keep a successful result under its fingerprint (replacing an older
        one), then evict. Disk errors are logged, never raised."""
        if not _FINGERPRINT.fullmatch(fingerprint):
            raise ValueError(f"not a fingerprint: {fingerprint!r}")
        if not result.get("files"):
            self._store_text(fingerprint, model, result)
            return
        # Files are assembled in a private temporary dir and renamed into
        # place, so a crash never leaves a half-written entry (start-up deletes
        # the temp) and a slow cross-filesystem copy holds no lock.
        tmp = self.directory / f"{_TMP_PREFIX}{fingerprint}-{uuid.uuid4().hex}"
        final = self.directory / fingerprint
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            cached, size = self._copy_in(result, tmp)
            cached = _with_paths(cached, final)
            # The JSON lives in the index and counts too, so text-only results
            # take part in LRU like the rest.
            size += len(canonical_json(cached).encode("utf-8"))
        except (OSError, KeyError, TypeError, ValueError) as exc:
            _remove(tmp)
            log.warning("cache: not caching %s: %s", fingerprint, exc)
            return
        with self._lock:
            # Index row first, files second: a crash in between leaves files
            # without a row, which start-up deletes, never a row without files.
            self.store.cache_delete(fingerprint)
            _remove(final)
            try:
                if tmp.exists():
                    tmp.rename(final)
            except OSError as exc:
                _remove(tmp)
                log.warning("cache: not caching %s: %s", fingerprint, exc)
                return
            self._put(fingerprint, model, cached, size)

    def _store_text(self, fingerprint: str, model: str, result: Mapping[str, Any]) -> None:
        """A result without files: one upsert replaces any older entry.

        Nothing to stage on disk, so no temporary dir and no delete-then-put.
        A folder an older entry with files left behind goes after the new row
        is in: a crash in between leaves files the index does not list, which
        start-up deletes.
        """
        try:
            cached, size = _text_entry(result)
        except (TypeError, ValueError) as exc:
            log.warning("cache: not caching %s: %s", fingerprint, exc)
            return
        with self._lock:
            self._put(fingerprint, model, cached, size)
            folder = self.directory / fingerprint
            if os.path.lexists(folder):
                _remove(folder)

    def _put(
        self, fingerprint: str, model: str, cached: JSON, size: int, now: float | None = None
    ) -> None:
        now = self.clock.now() if now is None else now
        self.store.cache_put(
            CacheEntry(
                fingerprint=fingerprint,
                model=model,
                result=cached,
                size_bytes=size,
                created_at=now,
                last_used_at=now,
            )
        )
        self.stored += 1
        self._held_bytes += size
        self._oldest_created_at = min(self._oldest_created_at, now)
        if self._eviction_possible(now):
            self._evict()

    def evict(self) -> EvictionPlan:
        """Apply the eviction plan for now; returns what was dropped."""
        with self._lock:
            return self._evict()

    def size_bytes(self) -> int:
        """Bytes the index accounts for (files plus result JSON)."""
        return sum(e.size_bytes for e in self.store.cache_entries())

    # -- internals -----------------------------------------------------------

    def _eviction_possible(self, now: float, adding: int = 0) -> bool:
        """Whether a full eviction plan could drop anything (once `adding`
        more bytes are held, put at `now`).

        Reading every index row after every write made each task cost O(cache
        size); the running totals answer the same question in O(1). They only
        ever over-estimate (an overwritten entry counts twice), which merely
        triggers the full plan, which then resets them exactly.
        """
        oldest = min(self._oldest_created_at, now)
        return self._held_bytes + adding > self.max_bytes or now - oldest >= self.ttl_s

    def _evict(self) -> EvictionPlan:
        entries = self.store.cache_entries()
        plan = plan_eviction(entries, self.clock.now(), self.max_bytes, self.ttl_s)
        dropped = set(plan.fingerprints)
        kept = [e for e in entries if e.fingerprint not in dropped]
        self._held_bytes = plan.kept_bytes
        self._oldest_created_at = min((e.created_at for e in kept), default=math.inf)
        for fp in plan.fingerprints:
            self._drop(fp)
        self.evicted_expired += len(plan.expired)
        self.evicted_lru += len(plan.over_cap)
        if plan:
            log.info(
                "cache: evicted %d expired and %d least recently used; %d bytes kept",
                len(plan.expired),
                len(plan.over_cap),
                plan.kept_bytes,
            )
        return plan

    def _drop(self, fingerprint: str) -> None:
        self.store.cache_delete(fingerprint)
        if _FINGERPRINT.fullmatch(fingerprint):
            _remove(self.directory / fingerprint)

    def _resolve(self, entry: CacheEntry) -> JSON | None:
        """The result with paths rebuilt under this directory, or None when a
        file is missing or has the wrong size (truncated, replaced)."""
        folder = self.directory / entry.fingerprint
        try:
            result = _with_paths(entry.result, folder)
            for f in _files(result):
                st = os.stat(f["path"])
                if "size" in f and st.st_size != f["size"]:
                    return None
        except (OSError, KeyError, TypeError):
            return None
        return result

    def _copy_in(self, result: Mapping[str, Any], tmp: Path) -> tuple[JSON, int]:
        cached: JSON = copy.deepcopy(dict(result))
        files = _files(cached)
        size = 0
        if files:
            tmp.mkdir(parents=True)
        for index, f in enumerate(files):
            src = Path(f["path"])
            dst = tmp / _safe_name(index, str(f.get("name") or src.name))
            _link_or_copy(src, dst)
            f["path"] = str(dst)
            actual = dst.stat().st_size
            f["size"] = actual  # what is on disk is what later checks compare
            size += actual
        return cached, size

    def _copy_out(self, result: JSON, dest: Path) -> JSON:
        dest.mkdir(parents=True, exist_ok=True)
        out: JSON = copy.deepcopy(result)
        for f in _files(out):
            src = Path(f["path"])
            dst = dest / src.name
            _remove(dst)  # a retry may find its own earlier copy there
            _link_or_copy(src, dst)
            f["path"] = str(dst)
        return out

    def _delete_unindexed(self, known: Mapping[str, set[str]]) -> None:
        for path in self.directory.iterdir():
            names = known.get(path.name)
            if not names or not path.is_dir() or path.is_symlink():
                log.info("cache: deleting %s, which the index does not know", path.name)
                _remove(path)
                continue
            for inner in path.iterdir():
                if inner.name not in names:
                    _remove(inner)


def _files(result: Mapping[str, Any]) -> list[dict[str, Any]]:
    files = result.get("files") or []
    if not isinstance(files, list) or not all(isinstance(f, dict) for f in files):
        raise TypeError("result 'files' must be a list of objects")
    return files


def _with_paths(result: Mapping[str, Any], folder: Path) -> JSON:
    """A copy of `result` whose file paths point into `folder` (same file names)."""
    out: JSON = copy.deepcopy(dict(result))
    for f in _files(out):
        f["path"] = str(folder / Path(f["path"]).name)
    return out


__all__ = ["CacheIndex", "EvictionPlan", "ResultCache", "is_expired", "plan_eviction"]


def _text_entry(result: Mapping[str, Any]) -> tuple[JSON, int]:
    """A result without files as the index keeps it, and its size in bytes;
    TypeError or ValueError when it is not JSON."""
    cached: JSON = dict(result)
    return cached, len(canonical_json(cached).encode("utf-8"))
