"""The result cache against real files: copies, reconciliation at start-up,
expiry and LRU eviction applied on disk and in the index."""

from __future__ import annotations

import errno
import hashlib
import os
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from dispatcher.clock import FakeClock
from dispatcher.store.sqlite import SqliteStore
from dispatcher.tasks.cache import CacheIndex, ResultCache

DAY = 24 * 3600.0
TTL = 7 * DAY
FP_A = "a" * 64
FP_B = "b" * 64
FP_C = "c" * 64


@pytest.fixture
async def cache_store(tmp_path: Path) -> AsyncIterator[CacheIndex]:
    store = SqliteStore(tmp_path / "index.db")
    await store.migrate()
    yield store.cache_index
    await store.close()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    return tmp_path / "cache"


@pytest.fixture
def make_cache(
    cache_store: CacheIndex, cache_dir: Path, clock: FakeClock
) -> Callable[..., ResultCache]:
    def make(max_bytes: int = 10**9, ttl_s: float = TTL) -> ResultCache:
        cache = ResultCache(cache_store, cache_dir, clock, max_bytes=max_bytes, ttl_s=ttl_s)
        cache.startup()
        return cache

    return make


@pytest.fixture
def produce(tmp_path: Path) -> Callable[..., dict[str, Any]]:
    """A task result as a runner returns it, with its files in a task dir."""

    def make(tag: str, contents: dict[str, bytes] | None = None) -> dict[str, Any]:
        task_dir = tmp_path / "results" / tag
        task_dir.mkdir(parents=True)
        files = []
        for name, data in (contents or {"out.png": tag.encode() * 10}).items():
            path = task_dir / name
            path.write_bytes(data)
            files.append(
                {
                    "path": str(path),
                    "name": name,
                    "size": len(data),
                    "content_type": "application/octet-stream",
                    "sha256": hashlib.sha256(data).hexdigest(),
                }
            )
        return {"text": f"answer {tag}", "files": files, "meta": {"tag": tag}}

    return make


def assert_files_valid(result: dict[str, Any], inside: Path) -> None:
    for f in result["files"]:
        path = Path(f["path"])
        assert path.is_file()
        assert path.parent.parent == inside or path.parent == inside
        assert hashlib.sha256(path.read_bytes()).hexdigest() == f["sha256"]


def test_hit_returns_files_that_outlive_the_task_dir(
    make_cache: Callable[..., ResultCache], produce: Callable[..., dict[str, Any]], cache_dir: Path
) -> None:
    cache = make_cache()
    result = produce("one", {"a.png": b"A" * 100, "a.png.2": b"B" * 50, "clip.mp4": b"V" * 10})
    cache.store_result(FP_A, "m", result)
    for f in result["files"]:
        os.unlink(f["path"])  # the task's own copy is gone: the cache must not care

    hit = cache.lookup(FP_A)
    assert hit is not None
    assert hit["text"] == "answer one" and hit["meta"] == {"tag": "one"}
    assert [f["name"] for f in hit["files"]] == ["a.png", "a.png.2", "clip.mp4"]
    assert_files_valid(hit, cache_dir)
    assert all(Path(f["path"]).parent == cache_dir / FP_A for f in hit["files"])
    assert (cache.hits, cache.misses, cache.stored) == (1, 0, 1)


def test_miss_is_counted(make_cache: Callable[..., ResultCache]) -> None:
    cache = make_cache()
    assert cache.lookup(FP_A) is None
    assert cache.lookup("../../etc") is None  # never a path, never an error
    assert (cache.hits, cache.misses) == (0, 2)


def test_text_only_result(make_cache: Callable[..., ResultCache], cache_dir: Path) -> None:
    cache = make_cache()
    cache.store_result(FP_A, "chat", {"text": "hello", "files": [], "meta": {}})
    assert cache.lookup(FP_A) == {"text": "hello", "files": [], "meta": {}}
    assert not (cache_dir / FP_A).exists()
    assert cache.size_bytes() > 0  # the JSON counts, so LRU still applies


def test_lookup_touches_last_use(
    make_cache: Callable[..., ResultCache],
    produce: Callable[..., dict[str, Any]],
    cache_store: CacheIndex,
    clock: FakeClock,
) -> None:
    cache = make_cache()
    cache.store_result(FP_A, "m", produce("a"))
    created = clock.now()
    clock.advance(60)
    assert cache.lookup(FP_A) is not None
    row = cache_store.cache_get(FP_A)
    assert row is not None
    assert row.created_at == created
    assert row.last_used_at == created + 60


def test_lookup_drops_an_entry_whose_files_vanished(
    make_cache: Callable[..., ResultCache],
    produce: Callable[..., dict[str, Any]],
    cache_store: CacheIndex,
    cache_dir: Path,
) -> None:
    cache = make_cache()
    cache.store_result(FP_A, "m", produce("a"))
    next((cache_dir / FP_A).iterdir()).unlink()
    assert cache.lookup(FP_A) is None
    assert cache_store.cache_get(FP_A) is None
    assert not (cache_dir / FP_A).exists()
    assert cache.misses == 1 and cache.dropped_missing == 1


def test_truncated_file_is_a_miss(
    make_cache: Callable[..., ResultCache],
    produce: Callable[..., dict[str, Any]],
    cache_dir: Path,
) -> None:
    cache = make_cache()
    cache.store_result(FP_A, "m", produce("a"))
    victim = next((cache_dir / FP_A).iterdir())
    os.truncate(victim, 3)
    assert cache.lookup(FP_A) is None


def test_expired_entry_is_a_miss_and_is_removed(
    make_cache: Callable[..., ResultCache],
    produce: Callable[..., dict[str, Any]],
    cache_store: CacheIndex,
    cache_dir: Path,
    clock: FakeClock,
) -> None:
    cache = make_cache()
    cache.store_result(FP_A, "m", produce("a"))
    clock.advance(TTL - 1)
    assert cache.lookup(FP_A) is not None  # a use does not extend the TTL...
    clock.advance(1)
    assert cache.lookup(FP_A) is None  # ...which counts from creation
    assert cache_store.cache_get(FP_A) is None
    assert not (cache_dir / FP_A).exists()
    assert cache.evicted_expired == 1


def test_write_evicts_least_recently_used_over_the_cap(
    make_cache: Callable[..., ResultCache],
    produce: Callable[..., dict[str, Any]],
    cache_store: CacheIndex,
    cache_dir: Path,
    clock: FakeClock,
) -> None:
    cache = make_cache()
    cache.store_result(FP_A, "m", produce("a", {"f": b"x" * 1000}))
    clock.advance(1)
    cache.store_result(FP_B, "m", produce("b", {"f": b"y" * 1000}))
    clock.advance(1)
    assert cache.lookup(FP_A) is not None  # A is now used more recently than B
    # Room for two entries of this size, not three (all three are the same size).
    row = cache_store.cache_get(FP_A)
    assert row is not None
    cache.max_bytes = 3 * row.size_bytes - 1
    clock.advance(1)
    cache.store_result(FP_C, "m", produce("c", {"f": b"z" * 1000}))

    assert {e.fingerprint for e in cache_store.cache_entries()} == {FP_A, FP_C}
    assert not (cache_dir / FP_B).exists()
    assert sorted(p.name for p in cache_dir.iterdir()) == [FP_A, FP_C]
    assert cache.evicted_lru == 1


def test_restoring_a_fingerprint_replaces_the_entry(
    make_cache: Callable[..., ResultCache],
    produce: Callable[..., dict[str, Any]],
    cache_dir: Path,
) -> None:
    cache = make_cache()
    cache.store_result(FP_A, "m", produce("old", {"x.bin": b"old"}))
    cache.store_result(FP_A, "m", produce("new", {"y.bin": b"new!"}))
    hit = cache.lookup(FP_A)
    assert hit is not None and hit["text"] == "answer new"
    assert [p.name for p in (cache_dir / FP_A).iterdir()] == ["0-y.bin"]


def test_a_text_result_replaces_an_entry_with_files(
    make_cache: Callable[..., ResultCache],
    produce: Callable[..., dict[str, Any]],
    cache_dir: Path,
) -> None:
    cache = make_cache()
    cache.store_result(FP_A, "m", produce("old", {"x.bin": b"old"}))
    cache.store_result(FP_A, "m", {"text": "now text", "files": [], "meta": {}})
    assert cache.lookup(FP_A) == {"text": "now text", "files": [], "meta": {}}
    assert not (cache_dir / FP_A).exists()  # the old entry's files went with it
    assert make_cache().lookup(FP_A) == {"text": "now text", "files": [], "meta": {}}


def test_a_miss_is_answered_here_and_a_hit_is_not(
    make_cache: Callable[..., ResultCache], produce: Callable[..., dict[str, Any]]
) -> None:
    cache = make_cache()
    assert cache.miss_here(FP_A) and cache.miss_here("../../etc")
    cache.store_result(FP_B, "m", produce("b"))
    assert not cache.miss_here(FP_B)  # a hit is file work: `lookup` in a thread
    assert (cache.hits, cache.misses) == (0, 2)


def test_nothing_is_answered_here_while_a_thread_holds_the_lock(
    make_cache: Callable[..., ResultCache],
) -> None:
    cache = make_cache()
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with cache._lock:
            held.set()
            release.wait(5)

    thread = threading.Thread(target=hold)
    thread.start()
    held.wait(5)
    try:
        assert not cache.miss_here(FP_A)
        assert not cache.store_text_here(FP_A, "chat", {"text": "hi", "files": [], "meta": {}})
    finally:
        release.set()
        thread.join()
    assert (cache.misses, cache.stored) == (0, 0)


def test_a_text_result_is_kept_here_unless_there_is_file_work(
    make_cache: Callable[..., ResultCache],
    produce: Callable[..., dict[str, Any]],
    cache_dir: Path,
    clock: FakeClock,
) -> None:
    cache = make_cache()
    text = {"text": "hello", "files": [], "meta": {}}
    assert cache.store_text_here(FP_A, "chat", text)
    assert cache.lookup(FP_A) == text and cache.stored == 1
    # Files to copy, or an older entry's folder to delete: `store_result`.
    with_files = produce("b")
    assert not cache.store_text_here(FP_B, "m", with_files)
    cache.store_result(FP_B, "m", with_files)
    assert not cache.store_text_here(FP_B, "chat", text)
    assert (cache_dir / FP_B).exists()
    # An eviction due after the put (over the cap, or the TTL run out): too.
    cache.max_bytes = cache.size_bytes()
    assert not cache.store_text_here(FP_C, "chat", text)
    cache.max_bytes = 10**9
    clock.advance(TTL)
    assert not cache.store_text_here(FP_C, "chat", text)
    assert cache.stored == 2


def test_index_survives_a_restart(
    make_cache: Callable[..., ResultCache],
    produce: Callable[..., dict[str, Any]],
    cache_dir: Path,
) -> None:
    make_cache().store_result(FP_A, "m", produce("a"))
    restarted = make_cache()  # a new process: nothing carried over in memory
    hit = restarted.lookup(FP_A)
    assert hit is not None
    assert_files_valid(hit, cache_dir)


def test_moved_cache_dir_keeps_working(
    cache_store: CacheIndex,
    produce: Callable[..., dict[str, Any]],
    tmp_path: Path,
    clock: FakeClock,
) -> None:
    first = tmp_path / "state-1" / "cache"
    ResultCache(cache_store, first, clock, 10**9, TTL).store_result(FP_A, "m", produce("a"))
    moved = tmp_path / "state-2" / "cache"
    moved.parent.mkdir()
    first.rename(moved)
    cache = ResultCache(cache_store, moved, clock, 10**9, TTL)
    cache.startup()
    hit = cache.lookup(FP_A)
    assert hit is not None
    assert_files_valid(hit, moved)


def test_startup_reconciles_disk_and_index(
    make_cache: Callable[..., ResultCache],
    produce: Callable[..., dict[str, Any]],
    cache_store: CacheIndex,
    cache_dir: Path,
) -> None:
    cache = make_cache()
    cache.store_result(FP_A, "m", produce("a"))
    cache.store_result(FP_B, "m", produce("b"))
    # Files the index does not know: a stray entry dir, a stray file, a temp
    # dir left by a crash mid-write, an extra file inside a known entry.
    (cache_dir / FP_C).mkdir()
    (cache_dir / FP_C / "0-orphan.png").write_bytes(b"o")
    (cache_dir / "stray.txt").write_text("x")
    (cache_dir / f".tmp-{FP_C}-123").mkdir()
    (cache_dir / FP_A / "9-extra").write_bytes(b"e")
    # A row whose files are gone.
    for p in (cache_dir / FP_B).iterdir():
        p.unlink()

    restarted = make_cache()

    assert sorted(p.name for p in cache_dir.iterdir()) == [FP_A]
    assert [p.name for p in (cache_dir / FP_A).iterdir()] == ["0-out.png"]
    assert {e.fingerprint for e in cache_store.cache_entries()} == {FP_A}
    assert restarted.dropped_missing == 1
    assert restarted.lookup(FP_A) is not None


def test_startup_evicts_expired_and_over_cap(
    make_cache: Callable[..., ResultCache],
    produce: Callable[..., dict[str, Any]],
    cache_store: CacheIndex,
    cache_dir: Path,
    clock: FakeClock,
) -> None:
    cache = make_cache()
    cache.store_result(FP_A, "m", produce("a", {"f": b"1" * 5000}))
    clock.advance(5 * DAY)
    cache.store_result(FP_B, "m", produce("b", {"f": b"2" * 5000}))
    clock.advance(1)
    cache.store_result(FP_C, "m", produce("c", {"f": b"3" * 5000}))
    clock.advance(3 * DAY)  # A is now 8 days old

    restarted = make_cache(max_bytes=7000)  # room for one entry only

    assert {e.fingerprint for e in cache_store.cache_entries()} == {FP_C}
    assert sorted(p.name for p in cache_dir.iterdir()) == [FP_C]
    assert (restarted.evicted_expired, restarted.evicted_lru) == (1, 1)


def test_copy_to_gives_the_task_its_own_files(
    make_cache: Callable[..., ResultCache],
    produce: Callable[..., dict[str, Any]],
    cache_store: CacheIndex,
    tmp_path: Path,
) -> None:
    cache = make_cache()
    cache.store_result(FP_A, "m", produce("a"))
    task_dir = tmp_path / "results" / "task-2"
    hit = cache.lookup(FP_A, copy_to=task_dir)
    assert hit is not None
    assert_files_valid(hit, task_dir)
    cache_store.cache_delete(FP_A)
    cache.startup()  # evicts the now-unknown cache files
    assert_files_valid(hit, task_dir)  # the task's copy is unaffected


def test_falls_back_to_copying_across_filesystems(
    make_cache: Callable[..., ResultCache],
    produce: Callable[..., dict[str, Any]],
    cache_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_links(src: Any, dst: Any) -> None:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", no_links)
    cache = make_cache()
    result = produce("a")
    cache.store_result(FP_A, "m", result)
    hit = cache.lookup(FP_A)
    assert hit is not None
    assert_files_valid(hit, cache_dir)
    assert os.stat(hit["files"][0]["path"]).st_nlink == 1


def test_hard_link_when_possible(
    make_cache: Callable[..., ResultCache], produce: Callable[..., dict[str, Any]]
) -> None:
    cache = make_cache()
    result = produce("a")
    cache.store_result(FP_A, "m", result)
    hit = cache.lookup(FP_A)
    assert hit is not None
    assert os.path.samefile(hit["files"][0]["path"], result["files"][0]["path"])


def test_missing_source_file_is_logged_not_raised(
    make_cache: Callable[..., ResultCache],
    produce: Callable[..., dict[str, Any]],
    cache_store: CacheIndex,
    cache_dir: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    cache = make_cache()
    result = produce("a")
    os.unlink(result["files"][0]["path"])
    cache.store_result(FP_A, "m", result)  # the task succeeded; caching is best effort
    assert cache_store.cache_get(FP_A) is None
    assert list(cache_dir.iterdir()) == []
    assert "not caching" in caplog.text


def test_rejects_a_fingerprint_that_is_not_a_name(make_cache: Callable[..., ResultCache]) -> None:
    with pytest.raises(ValueError, match="fingerprint"):
        make_cache().store_result("../escape", "m", {"text": "x", "files": []})


def test_unsafe_file_names_stay_inside(
    make_cache: Callable[..., ResultCache],
    produce: Callable[..., dict[str, Any]],
    cache_dir: Path,
) -> None:
    cache = make_cache()
    result = produce("a", {"x": b"data"})
    result["files"][0]["name"] = "../../.bashrc"
    cache.store_result(FP_A, "m", result)
    assert [p.name for p in (cache_dir / FP_A).iterdir()] == ["0-bashrc"]
