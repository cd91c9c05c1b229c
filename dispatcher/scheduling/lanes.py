"""Lanes: one per web account, one per API provider, built from the profiles.

A lane belongs to its owner (a web account or an API provider) and takes the
queued tasks of every model it serves (one queue per model); a model with
several accounts or providers is served by several lanes, and the first free
one takes its oldest task.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
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
    owner: str  # the web account or the API provider this lane belongs to
    queues: tuple[str, ...]  # which queued tasks it may take
    models: tuple[str, ...]
    concurrency: int


def build_lanes(profiles: Mapping[str, Profile], settings: Settings) -> dict[str, LaneSpec]:
    """Lanes for the loaded profiles; a provider quota outside 1..5 raises ConfigError."""
    lanes: dict[str, LaneSpec] = {}
    for account, models in sorted(web_models_by_account(profiles).items()):
        lanes[f"web:{account}"] = LaneSpec(
            name=f"web:{account}",
            kind=Kind.WEB,
            owner=account,
            queues=queues_of(models),
            models=tuple(sorted(m.name for m in models)),
            concurrency=WEB_ACCOUNT_CONCURRENCY,
        )
    for provider, models in sorted(api_models_by_provider(profiles).items()):
        comfyui_only = all(m.api is not None and m.api.style == "comfyui" for m in models)
        lanes[f"api:{provider}"] = LaneSpec(
            name=f"api:{provider}",
            kind=Kind.API,
            owner=provider,
            queues=queues_of(models),
            models=tuple(sorted(m.name for m in models)),
            concurrency=settings.provider_concurrency(
                provider, COMFYUI_CONCURRENCY if comfyui_only else profile_quota(models)
            ),
        )
    return lanes


def profile_quota(models: list[Profile]) -> int | None:
    """The smallest `[api] quota` the provider's profiles name, if any."""
    quotas = [m.api.quota for m in models if m.api is not None and m.api.quota is not None]
    return min(quotas) if quotas else None


def web_models_by_account(profiles: Mapping[str, Profile]) -> dict[str, list[Profile]]:
    """Each web account with the models it logs into."""
    by_account: dict[str, list[Profile]] = {}
    for profile in profiles.values():
        if profile.kind is Kind.WEB:
            for account in profile.accounts:
                by_account.setdefault(account, []).append(profile)
    return by_account


def api_models_by_provider(profiles: Mapping[str, Profile]) -> dict[str, list[Profile]]:
    """Each API provider with the models it serves (a model may list several)."""
    by_provider: dict[str, list[Profile]] = {}
    for profile in profiles.values():
        for provider in profile.provider_names:
            by_provider.setdefault(provider, []).append(profile)
    return by_provider


def queues_of(models: Iterable[Profile]) -> tuple[str, ...]:
    """The queues a lane takes from: one per model it serves (`Profile.queue`).

    Tasks stored before a model could have several providers sat in a
    per-provider queue ("api:<provider>"); store migration 4 moved them to
    their model's queue, so no lane needs to take the old name.
    """
    return tuple(sorted({m.queue for m in models}))


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
                owner=account,
                queues=tuple(sorted(f"web:{m}" for m in models)),
                models=tuple(sorted(models)),
                concurrency=WEB_ACCOUNT_CONCURRENCY,
            )
    return merged
