"""Re-reading profiles while serving: what changed, and what can be applied live.

A reload swaps profiles in place for the lanes that already run: a web
account whose browser profile the runner holds, an API provider whose client
exists, on hosts the outbound allowlist already has. A profile that would
need a new lane, runner or host is refused with the reason (a restart
applies it); a removed model's pending tasks wait until it comes back.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dispatcher.errors import ConfigError
from dispatcher.models import JSON, Kind
from dispatcher.profiles import Profile, ProfileSet
from dispatcher.scheduling.lanes import LaneSpec
from dispatcher.settings import Settings

# Settings a reload applies while serving; the rest (state dir, database,
# port, profiles dir, time scale, logging, timeouts) need a restart.
LIVE_SETTINGS = (
    "concurrency",
    "default_concurrency",
    "browser_keep_alive_s",
    "browser_memory_mb",
    "cache_max_bytes",
    "cache_ttl_s",
    "budgets",
)
# Pinned to the running values when the settings are read again.
PINNED_SETTINGS = (
    "state_dir",
    "database_url",
    "host_id",
    "shared_results_dir",
    "port",
    "demo",
    "time_scale",
    "profiles_dir",
    "log_format",
    "log_level",
)


def live_changes(running: Settings, fresh: Settings) -> dict[str, Any]:
    """The live settings whose value differs in `fresh`: name -> new value."""
    return {
        name: getattr(fresh, name)
        for name in LIVE_SETTINGS
        if getattr(fresh, name) != getattr(running, name)
    }


@dataclass
class ReloadPlan:
    profiles: dict[str, Profile]  # what will be loaded
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)  # model -> why not applied live
    invalid: dict[str, str] = field(default_factory=dict)  # model -> its profile's problems

    def to_json(self, found: ProfileSet) -> JSON:
        return {
            "added": self.added,
            "removed": self.removed,
            "changed": self.changed,
            "refused": self.refused,
            "invalid_profiles": [p.to_json() for p in found.problems],
            "models": sorted(self.profiles),
        }

    def summary(self) -> str:
        parts = [
            f"{what}: {', '.join(names)}"
            for what, names in (
                ("added", self.added),
                ("removed", self.removed),
                ("changed", self.changed),
                ("refused", sorted(self.refused)),
                ("invalid", sorted(self.invalid)),
            )
            if names
        ]
        return "; ".join(parts) or "no changes"


def check_pools(lanes: Mapping[str, LaneSpec], pool_size: Callable[[str], int | None]) -> None:
    """ConfigError when a provider's quota exceeds the pool its client was opened with."""
    for lane in lanes.values():
        pool = pool_size(lane.owner) if lane.kind is Kind.API else None
        if pool is not None and lane.concurrency > pool:
            raise ConfigError(
                f"concurrency for API provider {lane.owner!r} raised to "
                f"{lane.concurrency}: its connection pool holds {pool}; a restart applies it"
            )


def plan_reload(
    current: Mapping[str, Profile],
    found: ProfileSet,
    why_not_live: Callable[[Profile], str | None],
) -> ReloadPlan:
    """Which profiles to load after a reload; `why_not_live` says why one cannot be served now."""
    plan = ReloadPlan(profiles={}, invalid=found.invalid_models())
    for name, profile in sorted(found.profiles.items()):
        old = current.get(name)
        if old == profile:
            plan.profiles[name] = old
            continue
        why = why_not_live(profile)
        if why is not None:
            plan.refused[name] = f"needs a restart: {why}"
            if old is not None:
                plan.profiles[name] = old  # the running version stays until then
            continue
        plan.profiles[name] = profile
        (plan.changed if old is not None else plan.added).append(name)
    for name in sorted(current):
        if name not in found.profiles and name not in plan.profiles:
            plan.removed.append(name)
    return plan
