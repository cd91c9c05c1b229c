"""Which selectors a snapshot reads with native CSS (`snapshot.plain_css`)."""

from __future__ import annotations

import pytest

from dispatcher.profiles import WebSpec
from webrunner.looks import acts_directly
from webrunner.snapshot import plain_css


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("#composer", ("#composer", None)),
        (".msg.assistant >> nth=-1", (".msg.assistant", -1)),
        ("[data-testid=bot] >> nth=0", ("[data-testid=bot]", 0)),
        ("input[name=q]", ("input[name=q]", None)),
        ("div > p:not(.x)", ("div > p:not(.x)", None)),
    ],
)
def test_css_with_at_most_a_last_nth_is_plain(
    selector: str, expected: tuple[str, int | None]
) -> None:
    assert plain_css(selector) == expected


@pytest.mark.parametrize(
    "selector",
    [
        "text=Send",
        "css=#composer",  # an engine by name: left to Playwright, which knows them all
        "xpath=//button",
        "//button",
        "..",
        '"Send"',
        "'Send'",
        "#a >> #b",
        "#a >> nth=1 >> nth=0",
        "#a >> visible=true",
        "role=button[name='Send']",
        "",
    ],
)
def test_playwright_s_own_syntax_is_not_plain(selector: str) -> None:
    assert plain_css(selector) is None


def _spec(**web: str | None) -> WebSpec:
    base = {"url": "https://chat.example/", "logged_in": "#app", "answer": ".answer"}
    return WebSpec.model_validate({**base, **web})


@pytest.mark.parametrize(
    ("web", "direct"),
    [
        ({"input": "#q", "submit": "#go"}, True),
        ({"input": "textarea >> nth=0", "submit_key": "Enter"}, True),
        ({"input": "#q", "submit": "button:has-text('Send')"}, True),  # refused in the page
        ({"input": "#q", "submit": "text=Send"}, False),
        ({"input": "role=textbox", "submit": "#go"}, False),
    ],
)
def test_a_task_types_and_sends_directly_only_with_css_for_both(
    web: dict[str, str], direct: bool
) -> None:
    # Not direct: the spare tab is primed for Playwright's actions as well.
    assert acts_directly(_spec(**web)) is direct
