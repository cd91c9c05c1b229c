"""Model cards another host published: read back as that host's profile would build
the task, and a card that does not parse (another version, a damaged row) is skipped."""

from __future__ import annotations

import json

from dispatcher.hosts.modelcards import MAX_CARD_CHARS, publishable, read_cards
from dispatcher.models import Kind
from tests.support.helpers import api_profile


def test_a_published_card_reads_back_with_every_host_that_runs_the_model() -> None:
    profile = api_profile("m-api", max_attempts=5)
    cards = publishable({"m-api": profile}, ["m-api", "not-loaded"])
    assert list(cards) == ["m-api"]
    found = read_cards([("h1", "m-api", cards["m-api"]), ("h2", "m-api", cards["m-api"])])
    card = found["m-api"]
    assert card.hosts == ("h1", "h2")
    assert (card.kind, card.queue, card.max_attempts) == (Kind.API, profile.queue, 5)
    assert card.fingerprint_fields == profile.fingerprint_fields


def test_cards_that_do_not_parse_are_skipped() -> None:
    good = json.dumps(
        {"kind": "api", "queue": "q", "max_attempts": 3, "fingerprint_fields": ["prompt"]}
    )
    bad = [
        "not json",
        "[]",
        json.dumps({"kind": "fax", "queue": "q", "max_attempts": 3, "fingerprint_fields": []}),
        json.dumps({"kind": "api", "queue": 1, "max_attempts": 3, "fingerprint_fields": []}),
        json.dumps({"kind": "api", "queue": "q", "max_attempts": 99, "fingerprint_fields": []}),
        json.dumps({"kind": "api", "queue": "q", "max_attempts": 3, "fingerprint_fields": [1]}),
        json.dumps({"kind": "api", "queue": "q", "max_attempts": 3}),
        good[:-1] + ', "pad": "' + "x" * MAX_CARD_CHARS + '"}',
    ]
    found = read_cards([("h", f"m{i}", text) for i, text in enumerate(bad)] + [("h", "ok", good)])
    assert list(found) == ["ok"]
