"""Lanes: one per web account, one per API provider, built from the profiles."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from dispatcher.models import Kind
from dispatcher.profiles import Profile
from dispatcher.settings import Settings

# A logged-in web session runs exactly one generation at a time: a second one
# started in the same session breaks both (the field saw failure rates go from
# 7 % to 34 % when more workers were thrown at one account). This is a fact
# about the sites, not a tuning knob, so it is deliberately not a setting.
WEB_ACCOUNT_CONCURRENCY = 1
# A ComfyUI server executes one prompt at a time on its GPU; more in flight
# only wait in its queue, where our cancel and progress see less of them.
# The operator's per-provider setting still wins.
COMFYUI_CONCURRENCY = 1


@dataclass(frozen=True)
class LaneSpec:
    name: str  # "web:<account>" or "api:<provider>"
    kind: Kind
    account: str  # the web account or the API provider
    lane_groups: tuple[str, ...]  # which queued tasks it may take
    models: tuple[str, ...]
    concurrency: int


def build_lanes(profiles: Mapping[str, Profile], settings: Settings) -> dict[str, LaneSpec]:
    """Lanes for the loaded profiles; a provider quota outside 1..5 raises ConfigError."""
    web_models: dict[str, list[str]] = {}
    api_models: dict[str, list[str]] = {}
    comfyui_only: dict[str, bool] = {}
    for profile in profiles.values():
        if profile.kind is Kind.WEB:
            for account in profile.accounts:
                web_models.setdefault(account, []).append(profile.name)
        else:
            assert profile.provider is not None
            api_models.setdefault(profile.provider, []).append(profile.name)
            is_comfyui = profile.api is not None and profile.api.style == "comfyui"
            comfyui_only[profile.provider] = comfyui_only.get(profile.provider, True) and is_comfyui
    lanes: dict[str, LaneSpec] = {}
    for account, models in sorted(web_models.items()):
        lanes[f"web:{account}"] = LaneSpec(
            name=f"web:{account}",
            kind=Kind.WEB,
            account=account,
            lane_groups=tuple(sorted(f"web:{m}" for m in models)),
            models=tuple(sorted(models)),
            concurrency=WEB_ACCOUNT_CONCURRENCY,
        )
    for provider, models in sorted(api_models.items()):
        lanes[f"api:{provider}"] = LaneSpec(
            name=f"api:{provider}",
            kind=Kind.API,
            account=provider,
            lane_groups=(f"api:{provider}",),
            models=tuple(sorted(models)),
            concurrency=settings.provider_concurrency(
                provider, COMFYUI_CONCURRENCY if comfyui_only[provider] else None
            ),
        )
    return lanes


def with_added_accounts(
    lanes: Mapping[str, LaneSpec],
    added: Mapping[str, tuple[str, ...]],
    profiles: Mapping[str, Profile],
) -> dict[str, LaneSpec]:
    """`lanes` plus the web accounts added at run time, each serving its loaded web models.

    An account also listed in a profile serves the union of both lists; one
    whose models are all unloaded gets no lane (its row stays for later).
    """
    merged = dict(lanes)
    for account, wanted in sorted(added.items()):
        models = {m for m in wanted if m in profiles and profiles[m].kind is Kind.WEB}
        name = f"web:{account}"
        if name in merged:
            models |= set(merged[name].models)
        if models:
            merged[name] = LaneSpec(
                name=name,
                kind=Kind.WEB,
                account=account,
                lane_groups=tuple(sorted(f"web:{m}" for m in models)),
                models=tuple(sorted(models)),
                concurrency=WEB_ACCOUNT_CONCURRENCY,
            )
    return merged
