"""`[web.fields]`: which params a web model's page takes (issue 27)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dispatcher.clock import SystemClock
from dispatcher.errors import InputError
from dispatcher.profiles import Profile
from dispatcher.tasks.intake import Intake
from dispatcher.tasks.spec import TaskSpec
from dispatcher.tasks.webfields import check_web_params, uncarried_fingerprint_fields
from tests.support.servicecli import clean_env, run_cli


def _profile(**top: Any) -> Profile:
    fields = top.pop("fields", {})
    return Profile.model_validate(
        {
            "name": "studio",
            "kind": "web",
            "accounts": ["a"],
            "web": {
                "url": "http://127.0.0.1:9/studio",
                "logged_in": "#app",
                "input": "#prompt",
                "submit": "#go",
                "answer": "#result",
                "fields": fields,
            },
            **top,
        }
    )


STUDIO = _profile(fields={"seed": "#seed input", "steps": "#steps input[type=range]"})


def test_a_task_naming_a_field_the_profile_lacks_is_refused_at_submit() -> None:
    intake = Intake(store=None, clock=SystemClock(), profiles={"studio": STUDIO})  # type: ignore[arg-type]
    task = intake.new_task(TaskSpec("studio", {"prompt": "a fox", "seed": 7}), None, None)
    assert task.params == {"prompt": "a fox", "seed": 7}
    with pytest.raises(InputError, match=r"no field for negative_prompt.*prompt, seed, steps"):
        intake.new_task(TaskSpec("studio", {"prompt": "x", "negative_prompt": "y"}), None, None)
    with pytest.raises(InputError, match="seed: expected"):
        check_web_params(STUDIO, {"prompt": "x", "seed": [1, 2]})
    # A profile without fields takes the prompt as before (and lets other params by).
    check_web_params(_profile(), {"prompt": "x", "seed": 1})


def test_fields_cannot_take_the_prompt_or_the_reference_images() -> None:
    for name in ("prompt", "reference_image"):
        with pytest.raises(ValueError, match="is not a field"):
            _profile(fields={name: "#x"})


def test_fingerprinted_params_no_control_carries_are_named() -> None:
    assert uncarried_fingerprint_fields(STUDIO) == [
        "negative_prompt",
        "aspect_ratio",
        "duration",
        "resolution",
        "model_version",
        "style_preset",
    ]
    chosen = _profile(fingerprint_fields=["prompt", "seed"])
    assert uncarried_fingerprint_fields(chosen) == ["seed"]
    # The default list on a plain chat page: nothing to say.
    assert uncarried_fingerprint_fields(_profile()) == []


def test_check_warns_about_a_fingerprinted_param_carried_by_no_field(tmp_path: Path) -> None:
    target = tmp_path / "profiles"
    target.mkdir()
    (target / "studio.toml").write_text(
        'name = "studio"\nkind = "web"\naccounts = ["a"]\n'
        'fingerprint_fields = ["prompt", "seed", "steps"]\n'
        '[web]\nurl = "http://127.0.0.1:9/"\nlogged_in = "#app"\ninput = "#p"\n'
        'submit = "#go"\nanswer = "#r"\n[web.fields]\nseed = "#seed"\n'
    )
    env = clean_env({"DISPATCHER_STATE_DIR": str(tmp_path / "state")})
    result = run_cli(["check", str(target)], env, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "warning  studio: fingerprinted param `steps` reaches no control" in result.stderr
    assert "`seed`" not in result.stderr
