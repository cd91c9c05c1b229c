"""Reading a profiles dir collects every problem; a reload plan says what changes."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dispatcher.errors import ConfigError
from dispatcher.profiles import Profile, load_profiles, read_profiles
from dispatcher.service.reload import plan_reload
from tests.support.helpers import REPO

URLS = {"DEMO_API_URL": "http://127.0.0.1:9", "DEMO_WEB_URL": "http://127.0.0.1:9"}


def _dir(tmp_path: Path, *names: str) -> Path:
    target = tmp_path / "profiles"
    target.mkdir(exist_ok=True)
    for name in names:
        shutil.copy(REPO / "profiles" / f"{name}.toml", target / f"{name}.toml")
    return target


def test_every_problem_of_every_file_is_listed(tmp_path: Path) -> None:
    target = _dir(tmp_path, "demo-chat-api")
    # Two problems in one file: both are named, with their keys.
    (target / "two.toml").write_text(
        'name = "two"\nkind = "api"\nprovider = "p"\ncolour = "red"\nmax_attempts = 99\n'
        '[api]\nbase_url = "http://x"\nstyle = "chat"\n'
        '[api.submit]\npath = "/c"\n[api.result]\ntext = "a"\n'
    )
    (target / "unreadable.toml").write_text("name = \n")
    shutil.copy(target / "demo-chat-api.toml", target / "same-name.toml")
    found = read_profiles(target, URLS)
    problems = {(Path(p.file).name, p.key) for p in found.problems}
    assert problems == {
        ("two.toml", "colour"),
        ("two.toml", "max_attempts"),
        ("unreadable.toml", "(file)"),
        ("same-name.toml", "name"),
    }
    assert list(found.profiles) == ["demo-chat-api"]
    why = {p.key: p.why for p in found.problems}
    assert why["colour"] == "unknown key"
    assert "less than or equal to 10" in why["max_attempts"]
    assert "already defined by" in why["name"]
    # The broken file names its model: that model is refused with the reasons.
    invalid = found.invalid_models()
    assert set(invalid) == {"two"}
    assert "two.toml" in invalid["two"] and "unknown key `colour`" in invalid["two"]
    # The strict loader still stops, naming the first file and all its problems.
    with pytest.raises(ConfigError, match=r"same-name.toml: `name`"):
        load_profiles(target, URLS)


def _profile(name: str, provider: str = "demo", base_url: str = "http://a") -> Profile:
    return Profile.model_validate(
        {
            "name": name,
            "kind": "api",
            "provider": provider,
            "api": {
                "base_url": base_url,
                "submit": {"path": "/c"},
                "result": {"text": "a"},
            },
        }
    )


def test_reload_plan_applies_what_runs_and_refuses_the_rest(tmp_path: Path) -> None:
    from dispatcher.profiles import ProfileSet

    current = {"kept": _profile("kept"), "gone": _profile("gone"), "moved": _profile("moved")}
    found = ProfileSet(
        profiles={
            "kept": _profile("kept"),
            "moved": _profile("moved", base_url="http://b"),
            "new": _profile("new"),
            "far": _profile("far", base_url="http://far"),
        }
    )

    def why_not_live(profile: Profile) -> str | None:
        assert profile.api is not None
        return None if profile.api.base_url in ("http://a", "http://b") else "new host"

    plan = plan_reload(current, found, why_not_live)
    assert (plan.added, plan.removed, plan.changed) == (["new"], ["gone"], ["moved"])
    assert plan.refused == {"far": "needs a restart: new host"}
    assert sorted(plan.profiles) == ["kept", "moved", "new"]
    assert plan.profiles["kept"] is current["kept"]
    assert "removed: gone" in plan.summary()
