"""A gradio app's API as `apirunner.gradio_events` reads it (pure functions),
and what a `style = "gradio"` profile may say."""

from __future__ import annotations

import json
from typing import Any

import pytest

from apirunner.gradio_events import (
    SseLines,
    StreamTooLong,
    build_data,
    check_mapping,
    endpoint_parameters,
    fn_index,
    output_items,
    read_event,
)
from dispatcher.errors import ConfigError, InputError
from dispatcher.profiles import Profile

# As gradio 6 answers /gradio_api/info for tests/gradio_apps/api_image.py (trimmed).
INFO = {
    "named_endpoints": {
        "/paint": {
            "parameters": [
                {
                    "parameter_name": "prompt",
                    "parameter_has_default": False,
                    "component": "Textbox",
                },
                {"parameter_name": "seed", "parameter_has_default": True, "parameter_default": 0},
                {"parameter_name": "width", "parameter_has_default": True, "parameter_default": 64},
                {"parameter_name": "reference", "parameter_has_default": False},
            ]
        }
    }
}


def _data(**kw: Any) -> list[Any]:
    params = endpoint_parameters(INFO, "/paint")
    return build_data(
        params,
        "/paint",
        inputs=kw.get("inputs", {"prompt": "prompt", "seed": "seed"}),
        values=kw.get("values", {}),
        images=kw.get("images", ["reference"]),
        params=kw.get("params", {"prompt": "a cat"}),
        files=kw.get("files", {}),
    )


def test_params_go_by_name_in_the_endpoints_order_with_defaults_for_the_rest() -> None:
    assert _data(params={"seed": 7, "prompt": "a cat"}) == ["a cat", 7, 64, None]
    assert _data(values={"width": 128}) == ["a cat", 0, 128, None]
    upload = {"path": "/tmp/x.png", "meta": {"_type": "gradio.FileData"}}
    assert _data(files={"reference": upload})[3] == upload


def test_a_mapping_the_endpoint_does_not_take_is_refused_naming_its_parameters() -> None:
    with pytest.raises(InputError, match=r"no parameter 'steps'.*prompt, reference, seed, width"):
        _data(inputs={"prompt": "prompt", "steps": "steps"}, params={"prompt": "x", "steps": 3})
    with pytest.raises(InputError, match="needs parameter 'reference'"):
        _data(images=[])
    with pytest.raises(InputError, match="no API endpoint '/draw'; it has: /paint"):
        endpoint_parameters(INFO, "/draw")


def test_the_live_check_lists_every_problem() -> None:
    params = endpoint_parameters(INFO, "/paint")
    problems = check_mapping(params, ["prompt", "steps"], "/paint")
    assert problems == [
        "/paint has no parameter 'steps' (its parameters: prompt, seed, width, reference)",
        "/paint needs parameter 'reference', which the profile sets nowhere "
        "(map a task param to it in `inputs`, or give it in `values`)",
    ]


def test_events_become_rank_eta_progress_results_and_errors() -> None:
    def event(**msg: Any) -> Any:
        return read_event(json.dumps({"event_id": "e1", **msg}), "e1")

    queued = event(msg="estimation", rank=2, queue_size=3, rank_eta=4.5)
    assert (queued.kind, queued.rank, queued.eta_s) == ("queued", 2, 4.5)
    bar = [{"index": 1, "length": 4, "unit": "steps", "progress": None}]
    assert event(msg="progress", progress_data=bar).progress == 25.0  # percent
    done = event(msg="process_completed", success=True, output={"data": ["hi"]})
    assert (done.kind, done.output) == ("completed", ["hi"])
    failed = event(msg="process_completed", success=False, output={"error": "no GPU\n"})
    assert (failed.kind, failed.message) == ("failed", "no GPU")
    hidden = event(msg="process_completed", success=False, output={"error": None})
    assert "does not show its text" in hidden.message
    lost = read_event(
        '{"msg": "unexpected_error", "message": "404: Not Found", "session_not_found": true}',
        "e1",
    )
    assert (lost.kind, lost.message) == ("lost", "404: Not Found")
    assert read_event(json.dumps({"msg": "estimation", "event_id": "other"}), "e1").kind == "ignore"
    assert read_event("not json", "e1").kind == "ignore"
    assert event(msg="estimation", rank=-1, rank_eta="soon").rank is None


def test_files_are_found_at_any_depth_and_texts_kept() -> None:
    image = {"path": "/tmp/g/a.png", "url": "http://h/gradio_api/file=/tmp/g/a.png",
             "orig_name": "a.png", "meta": {"_type": "gradio.FileData"}}  # fmt: skip
    gallery = [{"image": {**image, "path": "/tmp/g/b.png", "orig_name": "b.png"}, "caption": None}]
    outputs = output_items(["done", image, gallery, 3.5])
    assert outputs.texts == ["done"]
    assert [(f.index, f.name) for f in outputs.files] == [(1, "a.png"), (2, "b.png")]
    assert outputs.values == [3.5]


def test_the_event_stream_is_split_into_payloads_and_bounded() -> None:
    lines = SseLines(max_line_bytes=64)
    assert lines.feed(b'data: {"msg": "he') == []
    assert lines.feed(b'artbeat"}\r\n\nevent: x\ndata: 1\n') == ['{"msg": "heartbeat"}', "1"]
    with pytest.raises(StreamTooLong):
        lines.feed(b"data: " + b"x" * 100)


def test_fn_index_is_read_from_the_config() -> None:
    config = {"dependencies": [{"id": 0, "api_name": "write"}, {"id": 3, "api_name": "paint"}]}
    assert fn_index(config, "/paint") == 3 and fn_index(config, "/nope") is None


def _profile(**api: Any) -> Profile:
    return Profile.model_validate(
        {"name": "g", "kind": "api", "provider": "p", "api": {"base_url": "http://h", **api}}
    )


def test_a_gradio_profile_needs_an_api_name_and_takes_no_other_styles_keys() -> None:
    good = _profile(style="gradio", api_name="/paint", inputs={"prompt": "prompt"})
    assert good.api is not None and good.api.api_name == "/paint"
    for api, message in (
        ({"style": "gradio"}, "needs `api_name"),
        ({"style": "gradio", "api_name": "paint"}, "needs `api_name"),
        ({"style": "gradio", "api_name": "/p", "workflow": "w.json"}, "takes no `workflow`"),
        (
            {"style": "gradio", "api_name": "/p", "inputs": {"a": "x"}, "values": {"x": 1}},
            "'x' is set twice",
        ),
        ({"style": "chat", "api_name": "/p"}, "only for style 'gradio'"),
    ):
        with pytest.raises((ConfigError, ValueError), match=message):
            _profile(**api)
