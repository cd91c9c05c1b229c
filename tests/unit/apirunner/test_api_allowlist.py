"""The outbound allowlist: only hosts named by profiles' base_url."""

from __future__ import annotations

from pathlib import Path

import pytest

from dispatcher.allowlist import Allowlist, origin_of, same_origin
from dispatcher.errors import HostNotAllowed, PermanentError
from dispatcher.profiles import load_profiles

PROFILES = Path(__file__).resolve().parents[3] / "profiles"


def test_hosts_come_from_the_loaded_profiles() -> None:
    profiles = load_profiles(PROFILES, {"DEMO_API_URL": "http://127.0.0.1:50001"})
    allowlist = Allowlist.from_profiles(profiles)
    assert allowlist.allows("http://127.0.0.1:50001/v1/videos")
    assert not allowlist.allows("http://127.0.0.1:50002/v1/videos")


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("http://127.0.0.1:8766/anything?x=1", True),
        ("http://127.0.0.1:8767/", False),
        ("http://localhost:8766/", False),  # same machine, different name: not named
        ("https://API.Example.com/v1", True),  # host names are case-insensitive
        ("https://api.example.com:443/v1", True),  # the default port is implied
        ("http://api.example.com/v1", False),  # port 80 is not 443
        ("https://api.example.com.evil.net/", False),
        ("https://evil.net/?https://api.example.com/", False),
        ("ftp://api.example.com/", False),
        ("/relative/path", False),
        ("not a url at all", False),
    ],
)
def test_allowlist_table(url: str, allowed: bool) -> None:
    allowlist = Allowlist.from_base_urls(["http://127.0.0.1:8766", "https://api.example.com"])
    assert allowlist.allows(url) is allowed


def test_a_refusal_names_the_host_and_is_permanent() -> None:
    allowlist = Allowlist.from_base_urls(["http://127.0.0.1:8766"])
    with pytest.raises(HostNotAllowed, match=r"evil\.example:9999") as info:
        allowlist.check("http://evil.example:9999/steal")
    assert isinstance(info.value, PermanentError)
    assert info.value.kind == "allowlist"


def test_origins() -> None:
    assert str(origin_of("https://h.example/x")) == "h.example:443"
    assert origin_of("mailto:x@y") is None
    assert same_origin("http://127.0.0.1:1/a", "http://127.0.0.1:1")
    assert not same_origin("http://127.0.0.1:2/a", "http://127.0.0.1:1")


def test_web_pages_are_allowlisted_too() -> None:
    profiles = load_profiles(
        PROFILES,
        {"DEMO_API_URL": "http://127.0.0.1:50001", "DEMO_WEB_URL": "http://127.0.0.1:50003"},
    )
    allowlist = Allowlist.from_profiles(profiles)
    assert allowlist.allows("http://127.0.0.1:50003/media/a.png")
    assert allowlist.allows("http://127.0.0.1:50001/v1/videos")
    assert not allowlist.allows("http://127.0.0.1:50002/media/a.png")
