"""docs/settings.md is the settings model's own table, current with the code."""

from __future__ import annotations

import pytest
from pydantic import Field

from dispatcher import settings_doc
from dispatcher.settings import Settings
from tests.support.helpers import REPO


def test_the_committed_settings_doc_is_the_generated_one() -> None:
    committed = (REPO / "docs" / "settings.md").read_text(encoding="utf-8")
    assert committed == settings_doc.render(), (
        "docs/settings.md is not what dispatcher/settings.py generates; regenerate it with "
        f"`{settings_doc.REGENERATE}` and commit it"
    )


def test_every_setting_is_in_the_doc_under_its_variable() -> None:
    text = settings_doc.render()
    for name in Settings.model_fields:
        assert f"| `DISPATCHER_{name.upper()}` |" in text, name
    assert "| `DISPATCHER_CONCURRENCY` | `{}` | live |" in text
    assert "| `DISPATCHER_CACHE_MAX_BYTES` | `2147483648` (2 GiB) | live |" in text
    assert "| `DISPATCHER_PORT` | a free one in 49152-65535 | restart |" in text


def test_a_setting_without_a_description_stops_the_generator() -> None:
    fields = {**Settings.model_fields, "new_knob_s": Field(default=1.0)}
    with pytest.raises(ValueError, match="'new_knob_s' has no description"):
        settings_doc.render(fields)  # type: ignore[arg-type]


def test_a_computed_default_must_say_what_it_is() -> None:
    with pytest.raises(ValueError, match="computed default"):
        settings_doc.shown_default("x", Field(default_factory=list))  # type: ignore[arg-type]
