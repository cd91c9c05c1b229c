"""Session files an operator imports: storage-state JSON and Netscape cookies.txt."""

from __future__ import annotations

import json

import pytest

from webrunner.cookies import (
    SESSION_COOKIE_KEEP_S,
    CookieFileError,
    parse_session_file,
    site_cookies,
)
from webrunner.login import Frame, input_calls

NOW = 1_700_000_000.0


def test_a_cookies_txt_line_becomes_a_cookie_with_its_flags() -> None:
    text = (
        "# Netscape HTTP Cookie File\n"
        "\n"
        "#HttpOnly_.example.com\tTRUE\t/\tTRUE\t1800000000\tsid\tabc\n"
        "example.com\tFALSE\t/app\tFALSE\t0\tlang\ten\n"
    )
    sid, lang = parse_session_file(text, now=NOW)
    assert sid == {
        "name": "sid",
        "value": "abc",
        "domain": ".example.com",
        "path": "/",
        "expires": 1800000000.0,
        "httpOnly": True,
        "secure": True,
        "sameSite": "Lax",
    }
    # A session cookie would vanish at the close that writes the profile.
    assert lang["expires"] == NOW + SESSION_COOKIE_KEEP_S
    assert lang["domain"] == "example.com" and lang["path"] == "/app" and not lang["httpOnly"]


@pytest.mark.parametrize(
    ("text", "fault"),
    [
        ("example.com\tFALSE\t/\tFALSE\t0\tsid\n", "line 1: 6 tab-separated fields"),
        ("# c\nexample.com\tmaybe\t/\tFALSE\t0\tsid\tv\n", "line 2: subdomains must be TRUE"),
        ("example.com\tFALSE\t/\tFALSE\tsoon\tsid\tv\n", "line 1: the expiry"),
        ("example.com\tFALSE\tapp\tFALSE\t0\tsid\tv\n", "line 1: the path"),
        ("# only comments\n", "holds no cookies"),
        ("   ", "empty"),
        ('{"cookies": [', "not valid JSON: line 1"),
        ('{"origins": []}', "`cookies` list"),
        ('{"cookies": [{"name": "a", "value": "b"}]}', "cookies[0].domain"),
        (
            '{"cookies": [{"name": "a", "value": "b", "domain": "x", "expires": "never"}]}',
            "cookies[0].expires",
        ),
        (
            '{"cookies": [{"name": "a", "value": "b", "domain": "x", "sameSite": "often"}]}',
            "cookies[0].sameSite",
        ),
    ],
)
def test_a_bad_file_names_the_line_or_field_at_fault(text: str, fault: str) -> None:
    with pytest.raises(CookieFileError, match=fault.replace("[", r"\[").replace("]", r"\]")):
        parse_session_file(text, now=NOW)


def test_a_storage_state_keeps_its_cookies_as_playwright_wrote_them() -> None:
    state = {
        "cookies": [
            {
                "name": "s",
                "value": "v",
                "domain": "127.0.0.1",
                "path": "/",
                "expires": 1900000000,
                "httpOnly": True,
                "secure": False,
                "sameSite": "strict",
            }
        ],
        "origins": [],
    }
    (cookie,) = parse_session_file(json.dumps(state), now=NOW)
    assert cookie["sameSite"] == "Strict" and cookie["expires"] == 1900000000.0


FRAME = Frame("", width_px=1000, height_px=500)


def test_a_click_lands_where_the_operator_pointed_on_the_frame() -> None:
    [(method, params)] = input_calls(
        {"type": "mouse", "action": "down", "x": 0.5, "y": 0.2, "button": "left"}, FRAME
    )
    assert method == "Input.dispatchMouseEvent"
    assert params == {"type": "mousePressed", "x": 500, "y": 100, "button": "left", "clickCount": 1}
    [(_, wheel)] = input_calls({"type": "wheel", "x": 0, "y": 1, "dy": 120}, FRAME)
    assert wheel["type"] == "mouseWheel" and wheel["deltaY"] == 120 and wheel["y"] == 500


def test_keys_type_text_and_special_keys_act() -> None:
    assert input_calls({"type": "key", "key": "é"}, None) == [("Input.insertText", {"text": "é"})]
    down, up = input_calls({"type": "key", "key": "Enter"}, None)
    assert down[1]["type"] == "keyDown" and down[1]["text"] == "\r" and up[1]["type"] == "keyUp"
    assert input_calls({"type": "text", "text": "pa55"}, None) == [
        ("Input.insertText", {"text": "pa55"})
    ]


@pytest.mark.parametrize(
    "event",
    [
        {"type": "key", "key": "F13"},
        {"type": "mouse", "action": "down", "x": 1.5, "y": 0},
        {"type": "mouse", "action": "drag", "x": 0, "y": 0},
        {"type": "voice"},
        {"type": "text", "text": ""},
    ],
)
def test_malformed_input_is_refused(event: dict[str, object]) -> None:
    from dispatcher.errors import InputError

    with pytest.raises(InputError):
        input_calls(event, FRAME)


@pytest.mark.parametrize(
    ("domain", "kept"),
    [
        ("chat.example.com", True),
        (".chat.example.com", True),
        (".example.com", True),  # a parent domain: sent to the page too
        ("eu.chat.example.com", True),  # a subdomain of the site
        (".bank.example", False),
        ("example.com.evil.org", False),
        ("other.example.com", False),  # a sibling is another site's
        (".com", False),  # a single label is no site's
        ("xchat.example.com", False),
    ],
)
def test_an_import_keeps_only_the_cookies_of_the_models_site(domain: str, kept: bool) -> None:
    cookie = {"name": "c", "value": "v", "domain": domain, "path": "/"}
    mine, dropped = site_cookies([cookie], "https://Chat.Example.com/app")
    assert (mine == [cookie], dropped) == (kept, 0 if kept else 1)


def test_an_import_for_a_site_on_an_address_keeps_that_address_only() -> None:
    cookies = [
        {"name": "a", "value": "v", "domain": "127.0.0.1", "path": "/"},
        {"name": "b", "value": "v", "domain": "0.0.1", "path": "/"},
        {"name": "c", "value": "v", "domain": "localhost", "path": "/"},
    ]
    mine, dropped = site_cookies(cookies, "http://127.0.0.1:8080/chat")
    assert [c["name"] for c in mine] == ["a"] and dropped == 2
