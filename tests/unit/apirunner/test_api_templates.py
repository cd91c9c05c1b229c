"""Body templates, paths and dotted lookups."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apirunner.templates import (
    MISSING,
    TemplateError,
    format_path,
    join_url,
    lookup,
    render_body,
    render_text,
    split_path,
    walk,
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=6,
)


def test_a_whole_placeholder_keeps_the_json_type() -> None:
    params = {"seconds": 8, "ratio": 1.5, "loop": False, "tags": ["a"], "extra": {"k": 1}}
    body = {"s": "{seconds}", "r": "{ratio}", "l": "{loop}", "t": "{tags}", "e": "{extra}"}
    assert render_body(body, params) == {
        "s": 8,
        "r": 1.5,
        "l": False,
        "t": ["a"],
        "e": {"k": 1},
    }


@given(value=json_values.filter(lambda v: v is not None))
def test_any_json_value_passes_through_unchanged(value: Any) -> None:
    assert render_body({"x": "{v}"}, {"v": value}) == {"x": value}


def test_a_missing_parameter_removes_the_key() -> None:
    body = {"model": "{model_version}", "prompt": "{prompt}", "seconds": "{duration}"}
    assert render_body(body, {"prompt": "a cat"}) == {"prompt": "a cat"}


def test_a_null_parameter_counts_as_missing() -> None:
    assert render_body({"seed": "{seed}"}, {"seed": None}) == {}


def test_nested_dicts_and_lists() -> None:
    body = {
        "model": "demo",
        "messages": [{"role": "user", "content": "{prompt}"}, "{maybe}"],
        "options": {"seed": "{seed}", "n": 1},
    }
    assert render_body(body, {"prompt": "hi", "seed": 7}) == {
        "model": "demo",
        "messages": [{"role": "user", "content": "hi"}],
        "options": {"seed": 7, "n": 1},
    }


def test_mixed_strings_are_formatted() -> None:
    body = {"name": "model-{version}/{size}px", "literal": "{{not a placeholder}}", "n": 3}
    assert render_body(body, {"version": 2, "size": 512}) == {
        "name": "model-2/512px",
        "literal": "{not a placeholder}",
        "n": 3,
    }


def test_a_mixed_string_missing_a_parameter_is_removed_too() -> None:
    assert render_body({"name": "model-{version}"}, {}) == {}
    assert render_text("model-{version}", {}) is MISSING


def test_only_bare_identifiers_are_placeholders() -> None:
    # str.format would evaluate these; a profile must never reach into objects.
    assert render_body({"x": "{a.__class__}", "y": "{a[0]}"}, {"a": "s"}) == {
        "x": "{a.__class__}",
        "y": "{a[0]}",
    }


def test_paths_quote_each_value_as_one_segment() -> None:
    assert format_path("/v1/videos/{id}/content", {"id": "video_1"}) == "/v1/videos/video_1/content"
    assert format_path("/v1/videos/{id}", {"id": "../admin?x=1"}) == "/v1/videos/..%2Fadmin%3Fx%3D1"
    # "." and ".." are steps in a path: encoded, they stay one segment.
    assert format_path("/h/jobs/{id}/status", {"id": ".."}) == "/h/jobs/%2E%2E/status"
    assert format_path("/h/jobs/{id}/status", {"id": "."}) == "/h/jobs/%2E/status"


def test_a_path_missing_a_value_is_an_error() -> None:
    with pytest.raises(TemplateError, match="id"):
        format_path("/v1/videos/{id}", {})
    with pytest.raises(TemplateError, match="empty"):
        format_path("/v1/videos/{id}/content", {"id": ""})  # would call /v1/videos//content


def test_join_url() -> None:
    assert join_url("http://h:1/", "/v1/x") == "http://h:1/v1/x"
    assert join_url("http://h:1/api", "v1/x") == "http://h:1/api/v1/x"


def test_dotted_lookup() -> None:
    doc = {"choices": [{"message": {"content": "hi"}}], "error": None}
    assert lookup(doc, "choices.0.message.content") == "hi"
    assert lookup(doc, "choices.-1.message.content") == "hi"
    assert lookup(doc, "choices.1.message") is MISSING
    assert lookup(doc, "choices.x") is MISSING
    assert lookup(doc, "error") is None
    assert lookup(doc, "error.message") is MISSING


def test_walk_stops_at_a_url_with_segments_left() -> None:
    doc = {"response_url": "http://h:1/r/1", "n": 1}
    found = walk(doc, split_path("response_url.images.0.url"))
    assert found.value == "http://h:1/r/1"
    assert found.rest == ("images", "0", "url")
    assert lookup(doc, "response_url.images.0.url") is MISSING
    assert walk(doc, split_path("response_url")).rest == ()


def test_an_image_placeholder_reads_the_value_prepared_for_its_form() -> None:
    from apirunner.templates import placeholders

    body = {
        "image": "{reference_image:data_url}",
        "raw": "data:image/png;base64,{reference_image:base64}",
        "refs": ["{reference_images:upload}"],
        "prompt": "{prompt}",
    }
    assert placeholders(body) == {
        ("reference_image", "data_url"),
        ("reference_image", "base64"),
        ("reference_images", "upload"),
        ("prompt", ""),
    }
    values = {
        "prompt": "p",
        "reference_image": "cat.png",  # the raw param never leaks into a form
        "reference_image:data_url": "data:image/png;base64,QUJD",
        "reference_image:base64": "QUJD",
    }
    assert render_body(body, values) == {
        "image": "data:image/png;base64,QUJD",
        "raw": "data:image/png;base64,QUJD",
        "refs": [],
        "prompt": "p",
    }
