"""Refs in batch files: where they go, what they may be, and that they are unique."""

from __future__ import annotations

from pathlib import Path

import pytest

from dispatcher.errors import InputError
from dispatcher.tasks.batchfile import read_batch_lines


def test_refs_in_flat_and_nested_jsonl_and_in_csv(tmp_path: Path) -> None:
    jsonl = tmp_path / "b.jsonl"
    jsonl.write_text(
        '{"model": "m", "ref": "shot-01", "prompt": "flat", "gen_s": 2}\n'
        '{"model": "m", "ref": "shot.02", "params": {"prompt": "nested"}, "force": true}\n'
        '{"model": "m", "prompt": "no ref"}\n'
    )
    tasks = [line.task for line in read_batch_lines(jsonl)]
    assert tasks[0] == {"model": "m", "ref": "shot-01", "params": {"prompt": "flat", "gen_s": 2}}
    assert tasks[1]["ref"] == "shot.02" and tasks[1]["force"] is True
    assert "ref" not in tasks[2]

    table = tmp_path / "b.csv"
    table.write_text("ref,model,prompt\nbanner_1,m,a banner\n,m,no ref here\n")
    tasks = [line.task for line in read_batch_lines(table)]
    assert tasks[0] == {"model": "m", "ref": "banner_1", "params": {"prompt": "a banner"}}
    assert "ref" not in tasks[1]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('{"model": "m", "ref": "a/b", "prompt": "x"}\n', ":1.ref must be"),
        ('{"model": "m", "ref": "..", "prompt": "x"}\n', ":1.ref must be"),
        ('{"model": "m", "ref": "' + "x" * 101 + '", "prompt": "x"}\n', ":1.ref must be"),
        ('{"model": "m", "ref": 7, "prompt": "x"}\n', ":1.ref must be"),
        (
            '{"model": "m", "ref": "dup", "prompt": "x"}\n\n{"model": "m", "ref": "dup"}\n',
            ":3: ref 'dup' is already used on line 1",
        ),
    ],
)
def test_bad_or_repeated_refs_name_their_line(tmp_path: Path, body: str, message: str) -> None:
    path = tmp_path / "b.jsonl"
    path.write_text(body)
    with pytest.raises(InputError) as caught:
        read_batch_lines(path)
    assert f"{path}{message}" in str(caught.value)


def test_repeated_refs_in_csv(tmp_path: Path) -> None:
    path = tmp_path / "b.csv"
    path.write_text("model,ref,prompt\nm,a,x\nm,a,y\n")
    with pytest.raises(InputError, match=r"b\.csv:3: ref 'a' is already used on line 2"):
        read_batch_lines(path)
