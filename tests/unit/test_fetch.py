"""The pure parts of the one fetch path: names, strict JSON, redirects, origins."""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx
import pytest

from dispatcher.fetch import (
    MAX_JSON_DEPTH,
    MAX_NAME_BYTES,
    BadJson,
    Origin,
    OriginJars,
    decode_json,
    origin_of,
    result_file_name,
    safe_file_name,
)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("v1.mp4", "v1.mp4"),
        ("../../x", "x"),
        ("..\\..\\win.png", "win.png"),
        ("a\x00b.png", "a_b.png"),
        ("..", "fallback.bin"),
        ("", "fallback.bin"),
        ("/", "fallback.bin"),
        (".hidden.png", "hidden.png"),
        ("caf\u00e9 \u2603.png", "caf_.png"),
    ],
)
def test_hostile_names_become_plain_file_names(raw: str, expected: str) -> None:
    assert safe_file_name(raw, "fallback.bin") == expected


@pytest.mark.parametrize("length", [256, 300, 5000])
def test_a_long_name_is_shortened_and_can_be_created(tmp_path: Path, length: int) -> None:
    raw = "n" * (length - 4) + ".png"
    name = safe_file_name(raw, "fallback.bin")
    assert len(name.encode()) <= MAX_NAME_BYTES
    assert name.endswith(".png")
    # The same start, another ending: another name.
    assert safe_file_name("n" * (length - 4) + "x.png", "f") != name
    (tmp_path / name).write_bytes(b"ok")  # no OSError 36
    assert os.listdir(tmp_path) == [name]


def test_a_long_name_without_an_extension_keeps_its_bound() -> None:
    name = safe_file_name("x" * 400, "f")
    assert len(name) <= MAX_NAME_BYTES and name.startswith("xxx")


def test_the_server_name_wins_over_the_url_and_the_type_fills_in() -> None:
    disposition = 'attachment; filename="' + "n" * 296 + '.png"'
    name = result_file_name("http://h/x", disposition, "image/png", "task1")
    assert len(name) <= MAX_NAME_BYTES and name.endswith(".png")
    encoded = "attachment; filename*=UTF-8''a%00b.png"
    assert result_file_name("http://h/x", encoded, "image/png", "t") == "a_b.png"
    assert result_file_name("http://h/x", "attachment; filename*=bogus''x", "image/png", "t")


@pytest.mark.parametrize(
    "body",
    [
        b"[" * 10_000 + b"]" * 10_000,
        b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1),
        b'{"a": NaN}',
        b'{"a": Infinity}',
        b'{"a": -Infinity}',
        b'{"a": "\\ud800"}',
        b'{"\\udfff": 1}',
        b"<html>bad gateway</html>",
        b"\xff\xfe",
        # Raw, not escaped: json.loads decodes bytes with surrogatepass, and
        # reads UTF-16 too (the walk is skipped only for plain ASCII bodies).
        b'{"a": "\xed\xa0\x80"}',
        '{"a": "\ud800"}'.encode("utf-16-le", "surrogatepass"),
    ],
)
def test_what_is_not_strict_bounded_json_is_a_bad_answer(body: bytes) -> None:
    with pytest.raises(BadJson):
        decode_json(body)


def test_strict_json_decodes() -> None:
    deep = b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH
    assert decode_json(deep) is not None
    data = {"a": [1, 2.5, "\u00e9\U0001f600", None, True], "b": {"c": 10**30}}
    assert decode_json(json.dumps(data).encode()) == data


def test_origins_tell_ports_apart() -> None:
    assert origin_of("http://127.0.0.1:5000/x") == Origin("127.0.0.1", 5000)
    assert origin_of("http://127.0.0.1:5000/x") != origin_of("http://127.0.0.1:5001/x")
    assert origin_of("https://Example.COM./a") == Origin("example.com", 443)
    assert origin_of("ftp://example.com/") is None


def test_cookies_go_back_to_the_origin_that_set_them_only() -> None:
    jars = OriginJars()
    a = httpx.URL("http://127.0.0.1:5000/login")
    b = httpx.URL("http://127.0.0.1:5001/media")
    answer = httpx.Response(
        200, headers={"set-cookie": "sid=abc; Path=/"}, request=httpx.Request("GET", a)
    )
    jars.extract(origin_of(a), answer)
    to_a = httpx.Request("GET", a.join("/next"))
    to_b = httpx.Request("GET", b)
    jars.apply(origin_of(to_a.url), to_a)
    jars.apply(origin_of(b), to_b)
    assert to_a.headers.get("cookie") == "sid=abc"
    assert "cookie" not in to_b.headers
