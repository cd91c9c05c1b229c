"""`[web] allow_hosts` and `downloads`: what a profile may say, and which URLs pass."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from dispatcher.profiles import Profile
from tests.support.helpers import web_profile
from webrunner.guard import policy_for


def _with(**web: object) -> Profile:
    base = web_profile().model_dump()
    base["web"] = {k: v for k, v in base["web"].items() if v is not None} | web
    return Profile.model_validate(base)


@pytest.mark.parametrize("entry", ["https://cdn.example.com", "cdn.example.com/x", "", "a b"])
def test_an_allow_hosts_entry_that_is_not_a_host_is_refused_by_name(entry: str) -> None:
    with pytest.raises(ValidationError, match="allow_hosts entry"):
        _with(allow_hosts=[entry])


def test_listed_hosts_and_the_pages_own_pass_and_nothing_else(tmp_path: Path) -> None:
    spec = _with(allow_hosts=["cdn.example.com", "api.example.net:8443", "*.media.org"]).web
    assert spec is not None
    policy = policy_for(spec, tmp_path, 1000)
    passes = [
        "http://127.0.0.1:9/chat/more",  # the profile's own url (host and port)
        "https://cdn.example.com/a.png",
        "wss://CDN.example.com./socket",
        "https://api.example.net:8443/x",
        "https://img.media.org/y.png",
        "data:image/png;base64,AAAA",
    ]
    blocked = [
        "http://127.0.0.1:10/steal",  # same host, another port
        "https://api.example.net/x",
        "https://media.org.evil.com/",
        "https://evilmedia.org/",
        "http://[::1]:9/",
    ]
    assert [url for url in passes if not policy.allows(url)] == []
    assert [url for url in blocked if policy.allows(url)] == []
    assert policy.downloads_dir is None  # downloads refused unless asked for


def test_without_allow_hosts_any_host_passes_and_downloads_go_to_the_given_dir(
    tmp_path: Path,
) -> None:
    spec = _with(downloads=True, max_download_bytes=5).web
    assert spec is not None
    policy = policy_for(spec, tmp_path, 1000)
    assert policy.allows("https://anything.example/")
    assert (policy.downloads_dir, policy.max_download_bytes) == (tmp_path, 5)
