"""Profiles naming several providers, and the lanes built from them."""

from __future__ import annotations

from pathlib import Path

import pytest

from dispatcher.allowlist import Allowlist
from dispatcher.errors import ConfigError
from dispatcher.profiles import parse_profile
from dispatcher.scheduling.lanes import build_lanes
from dispatcher.settings import Settings
from tests.support.helpers import api_profile

HEAD = """
name = "m"
kind = "api"
{providers}

[api]
base_url = "http://10.0.0.1:8188"
style = "comfyui"
workflow = "wf.json"
inputs = {{ prompt = "6.inputs.text" }}
"""
WORKFLOW = '{"6": {"class_type": "CLIPTextEncode", "inputs": {"text": ""}}}'


def _profile(tmp_path: Path, providers: str, tail: str = "") -> Path:
    (tmp_path / "wf.json").write_text(WORKFLOW)
    path = tmp_path / "m.toml"
    path.write_text(HEAD.format(providers=providers) + tail)
    return path


def test_each_provider_sees_its_own_base_url_and_key(tmp_path: Path) -> None:
    path = _profile(
        tmp_path,
        'providers = ["gpu-a", "gpu-b"]',
        '[api.providers.gpu-b]\nbase_url = "http://10.0.0.2:8188"\nauth_env = "GPU_B_KEY"\n',
    )
    profile = parse_profile(path)
    assert profile is not None and profile.provider_names == ("gpu-a", "gpu-b")
    a, b = profile.api_for("gpu-a"), profile.api_for("gpu-b")
    assert (a.base_url, a.auth_env) == ("http://10.0.0.1:8188", None)
    assert (b.base_url, b.auth_env) == ("http://10.0.0.2:8188", "GPU_B_KEY")
    assert b.graph == a.graph  # the workflow is shared
    with pytest.raises(ConfigError, match="not served by provider 'gpu-c'"):
        profile.api_for("gpu-c")
    allowlist = Allowlist.from_profiles({"m": profile})
    assert allowlist.allows("http://10.0.0.1:8188/x") and allowlist.allows("http://10.0.0.2:8188/y")

    lanes = build_lanes({"m": profile}, Settings(concurrency={"gpu-b": 2}))
    assert {name: lane.queues for name, lane in lanes.items()} == {
        "api:gpu-a": ("api-model:m",),
        "api:gpu-b": ("api-model:m",),
    }
    # ComfyUI style: one prompt at a time unless the operator says otherwise.
    assert (lanes["api:gpu-a"].concurrency, lanes["api:gpu-b"].concurrency) == (1, 2)


@pytest.mark.parametrize(
    ("providers", "tail", "message"),
    [
        ('provider = "a"\nproviders = ["b"]', "", "not both"),
        ("providers = []", "", "needs `provider`"),
        ('providers = ["a", "a"]', "", "names 'a' twice"),
        ('providers = ["a"]', '[api.providers.z]\nbase_url = "http://x:1"\n', "api.providers.z"),
        ('providers = ["a"]', '[api.providers.a]\nbase_uri = "http://x:1"\n', "base_uri"),
    ],
)
def test_a_bad_providers_table_names_the_file_and_the_key(
    tmp_path: Path, providers: str, tail: str, message: str
) -> None:
    path = _profile(tmp_path, providers, tail)
    with pytest.raises(ConfigError) as caught:
        parse_profile(path)
    assert str(path) in str(caught.value) and message in str(caught.value)


def test_a_provider_serving_two_models_takes_both_queues() -> None:
    one, two = api_profile("one", provider="p"), api_profile("two", provider="p")
    (lane,) = build_lanes({"one": one, "two": two}, Settings()).values()
    assert lane.queues == ("api-model:one", "api-model:two")
    assert lane.models == ("one", "two")
