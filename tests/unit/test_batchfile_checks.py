"""Batch files as the CLI reads them: CSV quoting, every bad line at once, the job limits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dispatcher.errors import InputError
from dispatcher.http.limits import MAX_JOB_BODY_BYTES
from dispatcher.tasks.batchfile import MAX_LISTED_PROBLEMS, read_batch_lines


def test_a_quoted_cell_over_several_lines_is_still_one_prompt(tmp_path: Path) -> None:
    table = tmp_path / "b.csv"
    table.write_text('model,prompt\nm,"two lines,\nof one prompt"\nm,next\n')
    lines = read_batch_lines(table)
    assert [(e.line, e.task["params"]["prompt"]) for e in lines] == [
        (2, "two lines,\nof one prompt"),
        (4, "next"),
    ]


def test_an_unclosed_quote_at_the_end_is_refused_naming_its_row(tmp_path: Path) -> None:
    table = tmp_path / "b.csv"
    table.write_text('model,prompt\nm,ok\nm,"never closed\nm,swallowed\nm,swallowed too\n')
    with pytest.raises(InputError, match=rf"^{table}:3: a quoted cell that starts in this row"):
        read_batch_lines(table)


def test_bad_csv_rows_and_bad_values_are_all_listed(tmp_path: Path) -> None:
    table = tmp_path / "b.csv"
    table.write_text(
        'model,prompt,force\nm,"a"b,\nm,fine,\nm,x,perhaps\n,no model,\nm,a,b,c\nm,last,\n'
    )
    with pytest.raises(InputError) as caught:
        read_batch_lines(table)
    text = str(caught.value)
    assert text.startswith(f"4 problems in {table}; nothing was sent:")
    assert f"{table}:2: a quoted cell must end with a quote" in text
    assert f"{table}:4: force must be true or false" in text
    assert f"{table}:5.model must be a non-empty string" in text
    assert f"{table}:6: 4 fields but the header names 3" in text
    assert f"{table}:3:" not in text and f"{table}:7:" not in text


def test_a_file_of_only_bad_lines_lists_a_bounded_number(tmp_path: Path) -> None:
    bad = tmp_path / "b.jsonl"
    bad.write_text("not json\n" * 500)
    with pytest.raises(InputError) as caught:
        read_batch_lines(bad)
    text = str(caught.value)
    assert text.count("not valid JSON") == MAX_LISTED_PROBLEMS
    assert text.endswith(f"... and {500 - MAX_LISTED_PROBLEMS} more")


def test_a_csv_that_grows_past_the_job_body_limit_as_json_is_refused_at_its_line(
    tmp_path: Path,
) -> None:
    # Under the file limit as CSV, over the job body limit once every row is a
    # JSON object with its keys: refused before sending, at the row that crosses.
    prompt = "p" * 1650
    rows = 10_000
    table = tmp_path / "b.csv"
    table.write_text("model,prompt\n" + f"m,{prompt}\n" * rows)
    assert table.stat().st_size < MAX_JOB_BODY_BYTES
    with pytest.raises(InputError, match=r"the tasks up to this line pass 16 MiB as one job"):
        read_batch_lines(table)


def test_invalid_utf8_names_its_line(tmp_path: Path) -> None:
    bad = tmp_path / "b.jsonl"
    bad.write_bytes(
        json.dumps({"model": "m", "prompt": "ok"}).encode()
        + b'\n{"model": "m", "prompt": "\xff"}\n'
    )
    with pytest.raises(InputError, match=rf"^{bad}:2: not UTF-8 text"):
        read_batch_lines(bad)
