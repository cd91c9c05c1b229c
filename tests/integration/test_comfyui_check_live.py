"""`dispatcher check --live` against the demo ComfyUI's `/object_info`
(issue 28, finding 5): what used to check ok and fail at the first task."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from demo.comfyui import start_demo_comfy
from tests.support.helpers import REPO
from tests.support.servicecli import clean_env, run_cli


def _profile(target: Path, name: str, url: str, workflow: dict[str, object], inputs: str) -> None:
    (target / "workflows").mkdir(exist_ok=True)
    (target / "workflows" / f"{name}.json").write_text(json.dumps(workflow))
    (target / f"{name}.toml").write_text(
        f'name = "{name}"\nkind = "api"\nprovider = "{name}"\n[api]\n'
        f'base_url = "{url}"\nstyle = "comfyui"\nworkflow = "workflows/{name}.json"\n'
        f"inputs = {{ {inputs} }}\n"
    )


async def test_check_live_names_unknown_nodes_wrong_inputs_and_types(tmp_path: Path) -> None:
    good = json.loads((REPO / "profiles/workflows/txt2img.json").read_text())
    bad = json.loads(json.dumps(good))
    bad["10"] = {"class_type": "UpscaleModelLoader", "inputs": {"model_name": "x.pth"}}
    bad["6"]["inputs"] = {"txt": "", "clip": ["4", 1]}  # renamed in a newer node version
    bad["3"]["inputs"]["model"] = ["4", 1]  # wired to the CLIP output
    bad["3"]["inputs"]["cfg"] = "seven"
    bad["4"]["inputs"]["ckpt_name"] = "not-installed.safetensors"
    comfy = await start_demo_comfy(time_scale=0.02)
    try:
        target = tmp_path / "profiles"
        target.mkdir()
        prompt = 'prompt = "title:Positive Prompt.text", steps = "3.inputs.steps"'
        _profile(target, "fine", comfy.url, good, prompt)
        _profile(target, "gpu", comfy.url, bad, 'prompt = "6.inputs.txt"')
        _profile(target, "gone", "http://127.0.0.1:9", good, prompt)
        # The CLI runs in a thread: the demo server answers on this loop.
        args = ["check", str(target), "--live"]
        wrong = await asyncio.to_thread(run_cli, args, clean_env({}), tmp_path)
    finally:
        await comfy.stop()
    assert f"live ok  fine on {comfy.url}: 1 workflow(s), 7 node(s), 2 mapped input(s)" in (
        wrong.stdout
    )
    assert wrong.returncode == 2, wrong.stdout
    said = wrong.stderr
    # The static check passes: only the server can tell.
    assert "3 profile(s) valid" in wrong.stdout
    for expected in (
        "node 10 (UpscaleModelLoader): the server has no node class 'UpscaleModelLoader'",
        "node 6 (CLIPTextEncode): required input 'text' is missing",
        "node 3 (KSampler) input model: takes MODEL, linked to node 4 output 1 (CLIP)",
        "node 3 (KSampler) input cfg: expects a FLOAT, the workflow has 'seven'",
        "node 4 (CheckpointLoaderSimple) input ckpt_name: 'not-installed.safetensors' is not",
        "prompt = '6.inputs.txt': CLIPTextEncode takes no input 'txt' on this server "
        "(it takes: text, clip)",
    ):
        assert expected in said, (expected, said)
    assert "live bad gone on http://127.0.0.1:9: cannot reach http://127.0.0.1:9/object_info" in (
        said
    )
