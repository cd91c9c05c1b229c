"""The result cache of two hosts on one PostgreSQL database, each with its own disk.

A host's cache holds the files on its own disk: another host's entry is a
miss there (it would have to fetch the files through that host; it runs
the task instead and keeps its own copy), and neither its start-up scan
nor its eviction ever drops the other host's entries.
"""

from __future__ import annotations

from pathlib import Path

from dispatcher.clock import FakeClock
from dispatcher.store import open_store
from dispatcher.tasks.cache import ResultCache
from tests.support.pgdb import migrated_database


async def test_each_host_sees_keeps_and_evicts_only_its_own_cache_entries(tmp_path: Path) -> None:
    clock = FakeClock()
    with migrated_database() as url:
        store_a, store_b = await open_store(url, "host-a"), await open_store(url, "host-b")
        try:
            made = tmp_path / "made.bin"
            made.write_bytes(b"a result made on host a")
            cache_a = ResultCache(store_a.cache_index, tmp_path / "a", clock, 10**6, 3600.0)
            cache_b = ResultCache(store_b.cache_index, tmp_path / "b", clock, 0, 3600.0)
            cache_a.startup()
            result = {"files": [{"path": str(made), "name": "made.bin"}]}
            cache_a.store_result("fp1", "m", result)

            # Host b starts (its scan finds nothing of its own) and evicts to a
            # cap of 0 bytes: host a's entry and files are untouched.
            cache_b.startup()
            cache_b.evict()
            assert cache_b.lookup("fp1") is None and cache_b.misses == 1
            hit = cache_a.lookup("fp1")
            assert hit is not None
            assert Path(hit["files"][0]["path"]).read_bytes() == b"a result made on host a"

            # Host b ran the task itself: its own copy, its own entry.
            cache_b.max_bytes = 10**6
            cache_b.store_result("fp1", "m", result)
            copy = cache_b.lookup("fp1")
            assert copy is not None and Path(copy["files"][0]["path"]).is_relative_to(
                tmp_path / "b"
            )
            assert cache_a.lookup("fp1") == hit
        finally:
            await store_a.close()
            await store_b.close()
