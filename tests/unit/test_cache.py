"""The eviction decision on its own: TTL from creation, then LRU by last use under the cap."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from dispatcher.models import CacheEntry
from dispatcher.tasks.cache import EvictionPlan, is_expired, plan_eviction

NOW = 1_700_000_000.0
DAY = 24 * 3600.0
TTL = 7 * DAY


def entry(fp: str, size: int, *, age: float = 0.0, idle: float = 0.0) -> CacheEntry:
    """An entry created `age` seconds ago and last used `idle` seconds ago."""
    return CacheEntry(
        fingerprint=fp,
        model="m",
        result={"text": fp, "files": [], "meta": {}},
        size_bytes=size,
        created_at=NOW - age,
        last_used_at=NOW - idle,
    )


def test_nothing_to_do_under_the_cap() -> None:
    plan = plan_eviction([entry("a", 10), entry("b", 20)], NOW, 30, TTL)
    assert plan == EvictionPlan(kept_bytes=30)
    assert not plan
    assert plan.fingerprints == ()


def test_ttl_counts_from_creation_not_last_use() -> None:
    # Used a second ago but created eight days ago: expired all the same.
    old_but_busy = entry("old", 1, age=8 * DAY, idle=1)
    fresh_but_idle = entry("fresh", 1, age=6 * DAY, idle=6 * DAY)
    plan = plan_eviction([old_but_busy, fresh_but_idle], NOW, 1_000, TTL)
    assert plan.expired == ("old",)
    assert plan.over_cap == ()
    assert plan.kept_bytes == 1


def test_ttl_boundary() -> None:
    assert is_expired(entry("a", 1, age=TTL), NOW, TTL)
    assert not is_expired(entry("a", 1, age=TTL - 0.001), NOW, TTL)


def test_least_recently_used_go_first_until_under_the_cap() -> None:
    entries = [
        entry("recent", 40, age=5, idle=1),
        entry("oldest-use", 40, age=1, idle=300),  # newest entry, but idle longest
        entry("middle", 40, age=9, idle=100),
    ]
    plan = plan_eviction(entries, NOW, 80, TTL)
    assert plan.over_cap == ("oldest-use",)
    assert plan.kept_bytes == 80
    plan = plan_eviction(entries, NOW, 79, TTL)
    assert plan.over_cap == ("oldest-use", "middle")
    assert plan.kept_bytes == 40


def test_expired_entries_free_room_before_lru_is_needed() -> None:
    entries = [entry("stale", 100, age=8 * DAY, idle=8 * DAY), entry("live", 50, idle=999)]
    plan = plan_eviction(entries, NOW, 60, TTL)
    assert plan.expired == ("stale",)
    assert plan.over_cap == ()
    assert plan.fingerprints == ("stale",)


def test_an_entry_larger_than_the_cap_is_dropped() -> None:
    plan = plan_eviction([entry("huge", 500)], NOW, 100, TTL)
    assert plan.over_cap == ("huge",)
    assert plan.kept_bytes == 0


def test_zero_cap_drops_everything() -> None:
    plan = plan_eviction([entry("a", 1), entry("b", 1, idle=5)], NOW, 0, TTL)
    assert plan.over_cap == ("b", "a")


def test_ties_are_broken_deterministically() -> None:
    same = [entry(fp, 10, age=3, idle=3) for fp in ("c", "a", "b")]
    assert plan_eviction(same, NOW, 10, TTL).over_cap == ("a", "b")
    assert plan_eviction(list(reversed(same)), NOW, 10, TTL).over_cap == ("a", "b")


entries_strategy = st.lists(
    st.builds(
        entry,
        fp=st.text(alphabet="0123456789abcdef", min_size=4, max_size=4),
        size=st.integers(0, 1_000),
        age=st.floats(0, 10 * DAY),
        idle=st.floats(0, 10 * DAY),
    ),
    max_size=30,
    unique_by=lambda e: e.fingerprint,
)


@settings(max_examples=200)
@given(entries_strategy, st.integers(0, 10_000))
def test_plan_properties(entries: list[CacheEntry], cap: int) -> None:
    plan = plan_eviction(entries, NOW, cap, TTL)
    by_fp = {e.fingerprint: e for e in entries}
    dropped = set(plan.fingerprints)
    kept = [e for e in entries if e.fingerprint not in dropped]

    # Expired means exactly: created at least the TTL ago.
    assert set(plan.expired) == {e.fingerprint for e in entries if is_expired(e, NOW, TTL)}
    assert not set(plan.expired) & set(plan.over_cap)
    # What stays fits, and the plan says how much that is.
    assert plan.kept_bytes == sum(e.size_bytes for e in kept) <= cap
    # LRU: every entry dropped for room was used no later than every one kept.
    for fp in plan.over_cap:
        assert all(by_fp[fp].last_used_at <= k.last_used_at for k in kept)
    # Minimal: keeping the last LRU victim back would break the cap.
    if plan.over_cap:
        assert plan.kept_bytes + by_fp[plan.over_cap[-1]].size_bytes > cap
    # Pure: same input, same plan.
    assert plan_eviction(list(reversed(entries)), NOW, cap, TTL) == plan
