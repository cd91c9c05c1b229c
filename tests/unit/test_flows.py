"""ComfyUI profiles: inputs by node title, several workflows, task-overridable
inputs, and a required reference image (issue 28, findings 6, 7, 8)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from dispatcher.errors import ConfigError, InputError
from dispatcher.flows import check_task_params
from dispatcher.profiles import Profile, parse_profile
from dispatcher.workflow import fill

REPO = Path(__file__).resolve().parents[2]

STUDIO = """
name = "studio"
kind = "api"
provider = "gpu-1"
[api]
base_url = "http://127.0.0.1:8188"
style = "comfyui"
{workflow}
{extra}
[api.inputs]
prompt = "title:Positive Prompt.text"
seed = "title:KSampler.seed"
steps = "title:KSampler.steps"
"""
BOTH = 'workflows = { txt2img = "flows/txt2img.json", img2img = "flows/img2img.json" }'
IMAGES = 'images = { reference_image = "title:Reference.image" }'


def _studio(tmp_path: Path, workflow: str = BOTH, extra: str = IMAGES) -> Profile:
    (tmp_path / "flows").mkdir(exist_ok=True)
    for name in ("txt2img", "img2img"):
        shutil.copy(REPO / f"profiles/workflows/{name}.json", tmp_path / f"flows/{name}.json")
    (tmp_path / "studio.toml").write_text(STUDIO.format(workflow=workflow, extra=extra))
    profile = parse_profile(tmp_path / "studio.toml")
    assert profile is not None
    return profile


def _graph(profile: Profile, params: dict[str, object]) -> dict[str, dict[str, Any]]:
    assert profile.api is not None
    flow = check_task_params(profile.api.flows, params)
    return fill(flow.graph, flow.places(params), params)


def test_inputs_named_by_title_follow_a_renumbered_export(tmp_path: Path) -> None:
    profile = _studio(tmp_path)
    assert profile.api is not None
    flows = profile.api.flows
    # The same titles sit at different node ids in the two exports.
    assert flows["txt2img"].inputs["prompt"] == "6.inputs.text"
    assert flows["img2img"].inputs["prompt"] == "16.inputs.text"
    txt = _graph(profile, {"prompt": "a fox", "steps": "12"})
    assert txt["6"]["inputs"]["text"] == "a fox" and txt["3"]["inputs"]["steps"] == 12


def test_an_ambiguous_or_missing_title_is_refused_at_load(tmp_path: Path) -> None:
    (tmp_path / "flows").mkdir()
    graph = json.loads((REPO / "profiles/workflows/txt2img.json").read_text())
    graph["7"]["_meta"]["title"] = "Positive Prompt"  # two nodes now share it
    (tmp_path / "flows/one.json").write_text(json.dumps(graph))
    (tmp_path / "studio.toml").write_text(
        STUDIO.format(workflow='workflow = "flows/one.json"', extra="")
    )
    with pytest.raises(ConfigError) as caught:
        parse_profile(tmp_path / "studio.toml")
    assert "the title 'Positive Prompt' is ambiguous: nodes 6, 7 have it" in str(caught.value)
    graph["7"]["_meta"]["title"] = "Negative Prompt"
    graph["6"]["_meta"]["title"] = "Prompt"
    (tmp_path / "flows/one.json").write_text(json.dumps(graph))
    with pytest.raises(ConfigError, match="no node titled 'Positive Prompt'"):
        parse_profile(tmp_path / "studio.toml")


def test_a_task_picks_its_workflow_and_the_first_is_the_default(tmp_path: Path) -> None:
    profile = _studio(tmp_path)
    assert profile.api is not None
    assert check_task_params(profile.api.flows, {"prompt": "x"}).name == "txt2img"
    ref = {"prompt": "x", "workflow": "img2img", "reference_image": "ref.png"}
    assert check_task_params(profile.api.flows, ref).name == "img2img"
    with pytest.raises(InputError, match="'inpaint' is not a workflow of this model"):
        check_task_params(profile.api.flows, {"workflow": "inpaint"})
    with pytest.raises(InputError, match="reference_image: not taken by workflow 'txt2img'"):
        check_task_params(profile.api.flows, {"prompt": "x", "reference_image": "ref.png"})


def test_a_workflow_that_loads_a_reference_image_refuses_a_task_without_one(
    tmp_path: Path,
) -> None:
    profile = _studio(tmp_path)
    assert profile.api is not None
    with pytest.raises(InputError) as caught:
        check_task_params(profile.api.flows, {"prompt": "x", "workflow": "img2img"})
    assert str(caught.value).startswith(
        "reference_image is required: workflow 'img2img' loads it at 10.inputs.image"
    )


def test_a_task_sets_only_the_inputs_the_profile_marks_overridable(tmp_path: Path) -> None:
    profile = _studio(tmp_path, extra=f'{IMAGES}\noverridable = ["title:KSampler.*"]')
    graph = _graph(profile, {"prompt": "x", "title:KSampler.cfg": "6.5"})
    assert graph["3"]["inputs"]["cfg"] == 6.5  # converted like any number input
    img = _graph(
        profile,
        {"workflow": "img2img", "reference_image": "r.png", "title:KSampler.sampler_name": "ddim"},
    )
    assert img["13"]["inputs"]["sampler_name"] == "ddim"
    assert profile.api is not None
    for refused in ("title:Save Image.filename_prefix", "title:KSampler.model", "3.inputs.nope"):
        with pytest.raises(InputError, match="unknown parameter"):
            check_task_params(profile.api.flows, {"prompt": "x", refused: "y"})


def test_workflow_and_workflows_are_one_or_the_other(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="one of the two"):
        _studio(tmp_path, workflow=f'{BOTH}\nworkflow = "flows/txt2img.json"')
