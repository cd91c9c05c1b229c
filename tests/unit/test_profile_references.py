"""Reference-image keys in profiles: mistakes are refused when the profile loads."""

from __future__ import annotations

from pathlib import Path

import pytest

from dispatcher.errors import ConfigError
from dispatcher.profiles import parse_profile

BASE = """name = "m"
kind = "api"
provider = "p"
[api]
base_url = "https://api.example.com"
style = "chat"
[api.result]
text = "text"
"""


def _profile(tmp_path: Path, extra: str) -> Path:
    path = tmp_path / "m.toml"
    path.write_text(BASE + extra)
    return path


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ('[api.submit]\nbody = { image = "{reference_image:jpeg}" }\n', "unknown form"),
        (
            '[api.submit]\nbody = { i = ["{reference_images:upload}"] }\n',
            "needs an \\[api.upload\\]",
        ),
        ('[api.submit]\n[api.references]\nformat = "gif"\n', "api.references.format"),
    ],
)
def test_reference_mistakes_are_refused_at_load(tmp_path: Path, extra: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_profile(_profile(tmp_path, extra))


def test_the_three_shapes_load(tmp_path: Path) -> None:
    profile = parse_profile(
        _profile(
            tmp_path,
            '[api.submit]\nbody = { a = "{reference_image:data_url}", '
            'b = "{reference_images:upload}" }\n'
            '[api.upload]\npath = "/v1/files"\n'
            '[api.references]\nmultipart_field = "input_reference"\nmax_edge_px = 512\n',
        )
    )
    assert profile is not None and profile.api is not None
    assert profile.api.upload is not None and profile.api.upload.field == "file"
    assert profile.api.references.upload_ttl_s == 3600
