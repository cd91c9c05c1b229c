"""SQLite: a result's cache entry put on the loop's thread shares the store's
next commit instead of making its own (`SqliteCacheIndex.ride`).

What another reader of the file sees is checked with a second connection,
as `sqlite3 dispatcher.db` would see it.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from dispatcher.models import CacheEntry
from dispatcher.store import Store, open_store
from dispatcher.store.cachesql import SqliteCacheIndex
from tests.support.tasks import api_task


def _entry(fingerprint: str, text: str = "x", at: float = 1.0) -> CacheEntry:
    return CacheEntry(fingerprint, "m", {"text": text}, len(text), created_at=at, last_used_at=at)


def _on_disk(path: Path) -> dict[str, str]:
    """The entries a second connection reads: fingerprint -> result text."""
    with sqlite3.connect(path) as other:
        rows = other.execute("SELECT fingerprint, result FROM cache_entries").fetchall()
    return {fingerprint: result for fingerprint, result in rows}


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "dispatcher.db"


@pytest.fixture
async def store(path: Path) -> AsyncIterator[Store]:
    opened = await open_store(f"sqlite:///{path}", "h1")
    yield opened
    await opened.close()


def _index(store: Store) -> SqliteCacheIndex:
    index = store.cache_index
    assert isinstance(index, SqliteCacheIndex)
    return index


async def test_a_put_is_answered_at_once_and_written_with_the_next_task_write(
    store: Store, path: Path
) -> None:
    index = _index(store)
    index.cache_put(_entry("fp-a"))
    assert index.cache_get("fp-a") == _entry("fp-a")
    assert _on_disk(path) == {}  # no commit of its own

    await store.insert_tasks([api_task("t1"), api_task("t2")])  # one transaction

    assert _on_disk(path) == {"fp-a": '{"text": "x"}'}
    assert index.cache_get("fp-a") == _entry("fp-a")


async def test_a_quiet_host_writes_its_puts_within_flush_s(store: Store, path: Path) -> None:
    index = _index(store)
    index.FLUSH_S = 0.01
    index.cache_put(_entry("fp-a"))
    for _ in range(500):
        if _on_disk(path):
            break
        await asyncio.sleep(0.01)
    assert _on_disk(path) == {"fp-a": '{"text": "x"}'}


async def test_closing_the_store_writes_what_is_pending(path: Path) -> None:
    first = await open_store(f"sqlite:///{path}", "h1")
    first.cache_index.cache_put(_entry("fp-a"))
    await first.close()

    again = await open_store(f"sqlite:///{path}", "h1")
    try:
        assert again.cache_index.cache_get("fp-a") == _entry("fp-a")
    finally:
        await again.close()


async def test_a_pending_entry_touched_or_deleted_is_written_as_left(
    store: Store, path: Path
) -> None:
    index = _index(store)
    index.cache_put(_entry("fp-a"))
    index.cache_put(_entry("fp-b"))
    index.cache_touch("fp-a", 7.0)
    index.cache_delete("fp-b")
    assert index.cache_get("fp-b") is None

    await store.insert_tasks([api_task("t1"), api_task("t2")])

    assert set(_on_disk(path)) == {"fp-a"}
    assert index.cache_entries() == [CacheEntry("fp-a", "m", {"text": "x"}, 1, 1.0, 7.0)]


async def test_a_worker_threads_put_is_written_at_once_over_an_older_pending_one(
    store: Store, path: Path
) -> None:
    index = _index(store)
    index.cache_put(_entry("fp-a", "old"))
    # A result with files is put from a worker thread: no loop to wait for.
    await asyncio.to_thread(index.cache_put, _entry("fp-a", "new"))
    assert _on_disk(path) == {"fp-a": '{"text": "new"}'}

    await store.insert_tasks([api_task("t1"), api_task("t2")])

    assert _on_disk(path) == {"fp-a": '{"text": "new"}'}
    assert index.cache_get("fp-a") == _entry("fp-a", "new")
