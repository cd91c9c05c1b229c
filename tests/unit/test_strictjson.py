"""Strict JSON: what the door refuses, and answers that never fail to encode."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dispatcher import strictjson
from dispatcher.errors import InputError
from dispatcher.tasks.batchfile import read_batch_lines
from dispatcher.tasks.spec import parse_spec


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        (b"NaN", "NaN is not JSON"),
        (b"[-Infinity]", "Infinity is not JSON"),
        (b'{"a": 1e400}', "finite"),
        (b"9223372036854775808", "64 bits"),
        (b"-" + b"1" * 5000, "64 bits"),
        (b'"\\ud800"', "lone surrogate"),
        (b'{"\\uDC00": 1}', "in a key"),
        (b"\xed\xa0\x80", "UTF-8"),  # a surrogate encoded as bytes
        (b"[" * 65 + b"]" * 65, "64 levels"),
        (b'{"a": ' * 100_000, "64 levels"),
        (b"{", "not valid JSON"),
    ],
)
def test_loads_refuses_with_a_message(raw: bytes, fragment: str) -> None:
    with pytest.raises(InputError, match=r"^request body: ") as caught:
        strictjson.loads(raw)
    assert fragment in str(caught.value)


def test_loads_takes_what_is_fine() -> None:
    assert strictjson.loads(b"[" * 64 + b"]" * 64) is not None
    # Brackets inside strings are text, not nesting.
    body = {"prompt": "[" * 500 + '\\"{' * 500, "n": -(2**63), "pair": "\U0001f600"}
    assert strictjson.loads(json.dumps(body).encode()) == body
    assert strictjson.loads('{"a": "\\ud83d\\ude00"}') == {"a": "\U0001f600"}


def test_check_value_names_the_place() -> None:
    with pytest.raises(InputError, match=r"task\.params\.a\[1\]: nan"):
        strictjson.check_value({"a": [1, math.nan]}, "task.params")
    deep: Any = []
    for _ in range(100):
        deep = [deep]
    with pytest.raises(InputError, match="64 levels"):
        strictjson.check_value(deep, "x")
    with pytest.raises(InputError, match="surrogate"):
        parse_spec({"model": "m", "params": {"prompt": "\udfff"}})


def test_batch_files_get_the_same_checks(tmp_path: Path) -> None:
    batch = tmp_path / "b.jsonl"
    batch.write_text('{"model": "m", "prompt": "a"}\n{"model": "m", "prompt": "b", "x": NaN}\n')
    with pytest.raises(InputError, match=r"b\.jsonl:2: NaN is not JSON"):
        read_batch_lines(batch)
    table = tmp_path / "b.csv"
    table.write_text("model,prompt,x\nm,a,Infinity\n")
    with pytest.raises(InputError, match="inf is not a JSON number"):
        read_batch_lines(table)


_ANY = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


def _refuse(name: str) -> Any:
    raise AssertionError(name)


@given(_ANY)
def test_dumps_always_gives_strict_json(value: Any) -> None:
    text = strictjson.dumps(value)
    json.loads(text, parse_constant=_refuse)
    text.encode("utf-8")
