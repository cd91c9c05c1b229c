"""What a host needs to accept a task for a model only another host runs.

Each host publishes a card per model it runs (`Store.publish_models`, at
start and after every reload): its kind, queue, attempts and fingerprint
fields, enough to build the task row as that host would. A task is claimed
by queue, so only a host with the profile ever runs it. ComfyUI models are
not published: their fingerprint and seed need the workflow file.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from dispatcher.models import Kind
from dispatcher.pricing import Pricing
from dispatcher.profiles import Profile

MAX_CARD_CHARS = 4096  # a card is a few short fields; anything longer is not ours


@dataclass(frozen=True)
class ModelCard:
    name: str
    kind: Kind
    queue: str
    max_attempts: int
    fingerprint_fields: tuple[str, ...]
    hosts: tuple[str, ...] = ()
    pricing: Pricing | None = None  # a task's estimated cost is the same on every host


def publishable(profiles: Mapping[str, Profile], models: Iterable[str]) -> dict[str, str]:
    """model -> card (JSON text) for the models this host runs."""
    cards: dict[str, str] = {}
    for model in models:
        profile = profiles.get(model)
        if profile is None or (profile.api is not None and profile.api.style == "comfyui"):
            continue
        cards[model] = json.dumps(
            {
                "kind": profile.kind.value,
                "queue": profile.queue,
                "max_attempts": profile.max_attempts,
                "fingerprint_fields": list(profile.fingerprint_fields),
                "pricing": profile.pricing.model_dump() if profile.pricing else None,
            }
        )
    return cards


def read_cards(rows: Iterable[tuple[str, str, str]]) -> dict[str, ModelCard]:
    """Cards other hosts published, by model; a row that does not parse is skipped
    (another version's card must not break a submit here)."""
    found: dict[str, ModelCard] = {}
    for host, model, text in rows:
        card = _card(model, text)
        if card is None:
            continue
        known = found.get(model)
        hosts = (*known.hosts, host) if known is not None else (host,)
        found[model] = ModelCard(
            card.name,
            card.kind,
            card.queue,
            card.max_attempts,
            card.fingerprint_fields,
            hosts,
            card.pricing,
        )
    return found


def _card(model: str, text: str) -> ModelCard | None:
    if len(text) > MAX_CARD_CHARS:
        return None
    try:
        raw = json.loads(text)
        fields = raw["fingerprint_fields"]
        card = ModelCard(
            name=model,
            kind=Kind(raw["kind"]),
            queue=raw["queue"],
            max_attempts=raw["max_attempts"],
            fingerprint_fields=tuple(fields),
            pricing=Pricing.model_validate(raw["pricing"]) if raw.get("pricing") else None,
        )
    except (ValueError, KeyError, TypeError):
        return None
    ok = (
        isinstance(card.queue, str)
        and isinstance(card.max_attempts, int)
        and 1 <= card.max_attempts <= 10
        and all(isinstance(f, str) for f in card.fingerprint_fields)
    )
    return card if ok else None
