"""Which selectors a snapshot reads with native CSS (`snapshot.plain_css`)."""

from __future__ import annotations

import pytest

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
