"""Web accounts' daily allowances (issue 30): the day an allowance counts,
the check before a claim, what the book says, and which profile sets it."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from dispatcher.errors import ConfigError
from dispatcher.profiles import parse_profile
from dispatcher.scheduling.allowances import (
    Allowance,
    AllowanceBook,
    allowance_check,
    allowances,
    last_reset,
    next_reset,
)


def _at(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def test_the_allowance_day_begins_at_the_last_reset_and_ends_at_the_next() -> None:
    at_midnight = 0
    at_0730 = 7 * 60 + 30
    assert last_reset(_at("2026-12-03T18:00:00"), at_midnight) == _at("2026-12-03T00:00:00")
    assert next_reset(_at("2026-12-03T18:00:00"), at_midnight) == _at("2026-12-04T00:00:00")
    # Before today's 07:30 the day began yesterday at 07:30.
    assert last_reset(_at("2026-12-03T07:29:59"), at_0730) == _at("2026-12-02T07:30:00")
    assert next_reset(_at("2026-12-03T07:29:59"), at_0730) == _at("2026-12-03T07:30:00")
    assert last_reset(_at("2026-12-03T07:30:00"), at_0730) == _at("2026-12-03T07:30:00")


def test_an_account_may_start_generations_until_its_allowance_is_used() -> None:
    now = _at("2026-12-03T18:00:00")
    allowance = Allowance(limit=30, reset_minute=0)
    assert allowance_check(allowance, 29, now) is None
    used = allowance_check(allowance, 30, now)
    assert used is not None and used.until == _at("2026-12-04T00:00:00")
    assert used.reason() == "allowance used, 30 of 30, until 00:00 UTC"
    over = allowance_check(Allowance(2, 7 * 60 + 30), 3, now)
    assert over is not None and over.reason() == "allowance used, 3 of 2, until 07:30 UTC"


async def test_the_book_counts_from_the_store_and_remembers_a_used_up_day() -> None:
    counted: list[tuple[str, float]] = []
    used = {"acct-1": 1}

    async def count(owner: str, since: float) -> int:
        counted.append((owner, since))
        return used.get(owner, 0)

    book = AllowanceBook({"acct-1": Allowance(2)}, count)
    now = _at("2026-12-03T18:00:00")
    assert await book.used_up("acct-1", now) is None
    assert await book.used_up("no-limit", now) is None  # no allowance: never asked
    assert counted == [("acct-1", _at("2026-12-03T00:00:00"))]
    used["acct-1"] = 2
    found = await book.used_up("acct-1", now + 1)
    assert found is not None and book.said("acct-1", now + 1) == found
    assert book.next_opening() == _at("2026-12-04T00:00:00")
    # Until the reset the count only grows: no need to ask again.
    assert await book.used_up("acct-1", now + 2) == found and len(counted) == 2
    view = await book.view("acct-1", now + 2)
    assert view == {
        "daily_limit": 2,
        "used": 2,
        "resets_at": "00:00 UTC",
        "reached": True,
        "until": _at("2026-12-04T00:00:00"),
        "reason": "allowance used, 2 of 2, until 00:00 UTC",
    }
    # The next day it is asked again (and the store's count starts over).
    used["acct-1"] = 0
    tomorrow = _at("2026-12-04T00:00:01")
    assert book.said("acct-1", tomorrow) is None
    assert await book.used_up("acct-1", tomorrow) is None
    # A reload that raises the limit is checked afresh.
    used["acct-1"] = 2
    assert await book.used_up("acct-1", tomorrow) is not None
    book.replace({"acct-1": Allowance(5)})
    assert book.said("acct-1", tomorrow) is None
    assert await book.used_up("acct-1", tomorrow) is None


def _profile(tmp_path: Path, name: str, accounts: str, extra: str) -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(
        f'name = "{name}"\nkind = "web"\naccounts = {accounts}\n[web]\n'
        'url = "http://127.0.0.1:1/chat"\nlogged_in = "#c"\ninput = "#c textarea"\n'
        f'submit = "#send"\nanswer = ".a"\n{extra}\n'
    )
    return path


def test_an_account_serving_two_limited_models_holds_the_stricter(tmp_path: Path) -> None:
    a = parse_profile(
        _profile(tmp_path, "a", '["x", "y"]', 'daily_limit = 30\ndaily_reset = "07:30"')
    )
    b = parse_profile(_profile(tmp_path, "b", '["y"]', "daily_limit = 10"))
    c = parse_profile(_profile(tmp_path, "c", '["z"]', ""))
    assert a is not None and b is not None and c is not None
    assert allowances([a, b, c]) == {"x": Allowance(30, 450), "y": Allowance(10, 0)}


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        ('daily_limit = 5\ndaily_reset = "24:00"', "daily_reset '24:00' is not a UTC time HH:MM"),
        ('daily_limit = 5\ndaily_reset = "7:30"', "daily_reset '7:30' is not a UTC time HH:MM"),
        ("daily_limit = 0", "daily_limit"),
    ],
)
def test_a_bad_allowance_is_refused_naming_the_key(tmp_path: Path, extra: str, said: str) -> None:
    with pytest.raises(ConfigError, match=said):
        parse_profile(_profile(tmp_path, "bad", '["x"]', extra))
