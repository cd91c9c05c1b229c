"""The Host check: exact parsing, so a look-alike name never passes for loopback."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dispatcher.http.security import host_is_loopback

LOOPBACK = ("127.0.0.1", "localhost", "[::1]")


@pytest.mark.parametrize(
    "host",
    ["127.0.0.1", "127.0.0.1:8080", "localhost", "LOCALHOST:1", "[::1]", "[::1]:49152"],
)
def test_loopback_names_pass(host: str) -> None:
    assert host_is_loopback(host)


@pytest.mark.parametrize(
    "host",
    [
        "[::1]evil.com",
        "[::1]evil.com:80",
        "[::1]:80evil",
        "[::1]:",
        "[::1]:+80",
        "[::1]:８０",  # full-width digits are digits to str.isdigit, not to a port
        "[::1",
        "::1",  # an IPv6 literal in Host must be bracketed (RFC 3986)
        "::1:80",
        "localhost.evil.com",
        "localhost:80:80",
        "localhost:",
        "127.0.0.1.nip.io",
        "127.0.0.1:80x",
        "evil.com",
        "",
        " localhost",
        "localhost ",
    ],
)
def test_look_alikes_fail(host: str) -> None:
    assert not host_is_loopback(host)


_PORTS = st.integers(min_value=0, max_value=65535).map(str)


@given(name=st.sampled_from(LOOPBACK), port=st.none() | _PORTS)
def test_every_loopback_name_with_any_port_passes(name: str, port: str | None) -> None:
    assert host_is_loopback(name if port is None else f"{name}:{port}")


@given(name=st.sampled_from(LOOPBACK), tail=st.text(min_size=1))
def test_anything_after_a_loopback_name_but_a_port_fails(name: str, tail: str) -> None:
    host = name + tail
    is_port = tail.startswith(":") and tail[1:].isascii() and tail[1:].isdecimal()
    assert host_is_loopback(host) is is_port


@given(host=st.text(alphabet=st.characters(codec="latin-1")))
def test_whatever_passes_is_a_loopback_name_and_digits(host: str) -> None:
    if host_is_loopback(host):
        name, colon, port = host.rpartition(":")
        if colon and port.isascii() and port.isdecimal() and not port.endswith("]"):
            host = name
        assert host.lower() in LOOPBACK
