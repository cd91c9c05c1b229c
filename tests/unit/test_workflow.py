"""ComfyUI workflows in profiles: loading, checking the mapping, filling params."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from dispatcher.errors import ConfigError, InputError
from dispatcher.profiles import load_profiles, parse_profile
from dispatcher.scheduling.lanes import build_lanes
from dispatcher.settings import Settings
from dispatcher.workflow import check_params, fill, with_seed

REPO = Path(__file__).resolve().parents[2]
WORKFLOW = json.loads((REPO / "profiles/workflows/txt2img.json").read_text())
INPUTS = {"prompt": "6.inputs.text", "seed": "3.inputs.seed", "steps": "3.inputs.steps"}

PROFILE = """
name = "comfy"
kind = "api"
provider = "gpu-1"
[api]
base_url = "http://127.0.0.1:8188"
style = "comfyui"
workflow = "flows/txt2img.json"
inputs = {{ prompt = "6.inputs.text", seed = "3.inputs.seed" }}
{extra}
"""


def _profile_dir(tmp_path: Path, extra: str = "", workflow: object = WORKFLOW) -> Path:
    (tmp_path / "flows").mkdir(exist_ok=True)
    (tmp_path / "flows/txt2img.json").write_text(json.dumps(workflow))
    (tmp_path / "comfy.toml").write_text(PROFILE.format(extra=extra))
    return tmp_path


def test_the_workflow_is_loaded_relative_to_the_profile(tmp_path: Path) -> None:
    profiles = load_profiles(_profile_dir(tmp_path))  # the flows/ dir is not a profile
    assert profiles["comfy"].api is not None
    assert profiles["comfy"].api.graph["3"]["class_type"] == "KSampler"


@pytest.mark.parametrize(
    ("extra", "workflow", "expected"),
    [
        ('outputs = ["99"]', WORKFLOW, "outputs names node '99'"),
        ('images = { ref = "12.inputs.image" }', WORKFLOW, "no node 12"),
        ('images = { ref = "3.inputs.image" }', WORKFLOW, "node 3 (KSampler) has no inputs.image"),
        ("sampler = 'euler'", WORKFLOW, "unknown key `api.sampler`"),
        ("[api.status]\npath = '/x'", WORKFLOW, "takes no [api.status]"),
        ("", {"nodes": [], "links": []}, "UI format; export it with 'Export (API)'"),
        ("", {"3": {"inputs": {}}}, "node '3' has no class_type"),
    ],
)
def test_a_bad_workflow_or_mapping_is_refused_at_load_naming_the_file(
    tmp_path: Path, extra: str, workflow: object, expected: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_profile(_profile_dir(tmp_path, extra, workflow) / "comfy.toml")
    assert expected in str(caught.value) and "comfy.toml" in str(caught.value)


def test_a_missing_workflow_file_is_a_clear_error(tmp_path: Path) -> None:
    _profile_dir(tmp_path)
    (tmp_path / "flows/txt2img.json").unlink()
    with pytest.raises(ConfigError, match="cannot read workflow"):
        parse_profile(tmp_path / "comfy.toml")


def test_comfyui_keys_belong_to_the_comfyui_style_only(tmp_path: Path) -> None:
    (tmp_path / "chat.toml").write_text(
        'name = "c"\nkind = "api"\nprovider = "p"\n[api]\nbase_url = "http://h"\n'
        'workflow = "x.json"\n[api.submit]\npath = "/"\n[api.result]\ntext = "t"\n'
    )
    with pytest.raises(ConfigError, match="`workflow` is only for style 'comfyui'"):
        parse_profile(tmp_path / "chat.toml")


def test_a_comfyui_lane_defaults_to_one_at_a_time_unless_the_operator_says(
    tmp_path: Path,
) -> None:
    profiles = load_profiles(_profile_dir(tmp_path))
    assert build_lanes(profiles, Settings())["api:gpu-1"].concurrency == 1
    assert build_lanes(profiles, Settings(concurrency={"gpu-1": 2}))["api:gpu-1"].concurrency == 2


def test_fill_puts_each_value_in_its_node_and_converts_numbers() -> None:
    graph = fill(WORKFLOW, INPUTS, {"prompt": "a fox", "seed": "42", "steps": 30.0})
    assert graph["6"]["inputs"]["text"] == "a fox"
    assert graph["3"]["inputs"]["seed"] == 42 and graph["3"]["inputs"]["steps"] == 30
    assert WORKFLOW["6"]["inputs"]["text"] == ""  # the loaded workflow is untouched
    with pytest.raises(InputError, match="steps: expected a whole number"):
        fill(WORKFLOW, INPUTS, {"steps": 2.5})
    with pytest.raises(InputError, match="seed: expected a number"):
        fill(WORKFLOW, INPUTS, {"seed": "lucky"})


def test_unknown_parameters_are_refused_with_the_known_ones() -> None:
    with pytest.raises(InputError) as caught:
        check_params({"prompt": "x", "cfg": 7, "sampler": "euler"}, INPUTS, {"ref": "10.x"})
    assert str(caught.value) == (
        "unknown parameters cfg, sampler for this workflow; known: prompt, ref, seed, steps"
    )
    with pytest.raises(InputError, match="prompt: expected a string or a number"):
        check_params({"prompt": ["a", "b"]}, INPUTS, {})


def test_a_missing_seed_is_drawn_once_and_a_given_one_is_kept() -> None:
    rng = random.Random(1)
    drawn = with_seed({"prompt": "x"}, INPUTS, rng)
    assert isinstance(drawn["seed"], int) and 0 <= drawn["seed"] < 2**53
    assert with_seed({"prompt": "x", "seed": 9}, INPUTS, rng)["seed"] == 9
    assert isinstance(with_seed({"seed": None}, INPUTS, rng)["seed"], int)  # null is "not given"
    assert "seed" not in with_seed({"prompt": "x"}, {"prompt": "6.inputs.text"}, rng)
