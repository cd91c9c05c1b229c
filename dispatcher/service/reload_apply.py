"""The apply step of a reload (`reload.py` plans it): what the running parts take live.

The settings are read again and the live ones pushed into the runners and
the cache; a profile is checked against the runners it would need; an API
provider a reload brings gets its client. The service calls these in order.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from pydantic import ValidationError
from pydantic_settings import SettingsError

from dispatcher.errors import ConfigError, InputError, LockHeld
from dispatcher.models import JSON, Kind
from dispatcher.profiles import Profile
from dispatcher.scheduling.lanes import LaneSpec, build_lanes
from dispatcher.scheduling.protocol import Runner
from dispatcher.service.reload import LIVE_SETTINGS, PINNED_SETTINGS, check_pools, live_changes
from dispatcher.settings import Settings
from dispatcher.settings_sources import describe, env_name, shown, where_set

if TYPE_CHECKING:
    from dispatcher.tasks.cache import ResultCache

# The reload's lines are the service's own (operators filter on this name).
log = logging.getLogger("dispatcher.service")


def why_not_live(runners: Mapping[Kind, Runner], profile: Profile) -> str | None:
    """Why a new or changed profile cannot be served without a restart, if so.

    An owner it brings (a web account: locked, its dir made) is taken on
    here, so that its lane can open with the reload.
    """
    runner = runners.get(profile.kind)
    if runner is None:
        kind = profile.kind.value
        return f"no {kind} runner was started (no {kind} model at start)"
    url = profile.api.base_url if profile.api else profile.web.url if profile.web else ""
    if not runner.allowlist.allows(url):
        return f"host of {url} is not on this run's outbound allowlist"
    for owner in profile.accounts:
        try:
            runner.add_owner(owner)
        except (InputError, LockHeld, ConfigError) as exc:
            return str(exc)
    return None


def reload_settings(
    running: Settings,
    profiles: Mapping[str, Profile],
    runners: Mapping[Kind, Runner],
    cache: ResultCache,
) -> tuple[Settings, JSON]:
    """Read the settings again; apply the live ones (LIVE_SETTINGS) or say why not.

    Returns the settings now in force (the running ones when refused) and
    the reload answer's settings part: what changed, why not, and where each
    live value set in several places (or changed) was taken from."""
    sources = _live_sources()
    try:
        fresh = type(running)(**{name: getattr(running, name) for name in PINNED_SETTINGS})
        changed = live_changes(running, fresh)
        candidate = running.model_copy(update=changed)
        _check_concurrency(profiles, candidate, runners)
    except (ValidationError, SettingsError, ConfigError) as exc:
        why = str(exc) if isinstance(exc, ConfigError) else describe(exc)
        log.error("reload: settings not applied: %s", why)
        return running, {"settings": {}, "settings_error": why, "settings_sources": sources}
    for runner in runners.values():
        runner.apply_settings(candidate)
    cache.max_bytes = candidate.cache_max_bytes
    cache.ttl_s = candidate.cache_ttl_s
    if changed:
        log.info(
            "reload: settings changed: %s",
            ", ".join(f"{k}={v}" for k, v in sorted(changed.items())),
        )
    shown = {k: v for k, v in sources.items() if k in changed or len(v) > 1}
    return candidate, {"settings": changed, "settings_error": None, "settings_sources": shown}


def _live_sources() -> dict[str, list[JSON]]:
    """Each live setting set somewhere: its sources, the one used first."""
    out: dict[str, list[JSON]] = {}
    for name in LIVE_SETTINGS:
        found = where_set(name)
        if found:
            out[name] = [
                {"variable": env_name(name), "source": f.source, "value": shown(name, f.raw)}
                for f in found
            ]
    return out


def _check_concurrency(
    profiles: Mapping[str, Profile], settings: Settings, runners: Mapping[Kind, Runner]
) -> None:
    runner = runners.get(Kind.API)
    check_pools(build_lanes(profiles, settings), runner.pool_size if runner else lambda _: None)


async def add_api_providers(
    runners: Mapping[Kind, Runner], profiles: Mapping[str, Profile], lanes: Mapping[str, LaneSpec]
) -> None:
    """What serving a reload's profiles needs: a client for every API
    provider it brought (on an allowed host)."""
    for kind, runner in runners.items():
        concurrency = {lane.owner: lane.concurrency for lane in lanes.values() if lane.kind is kind}
        await runner.add_profiles(profiles, concurrency)
