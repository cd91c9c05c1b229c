"""A stored task row read back: every JSON column as written, and a damaged one
shown empty without costing the task its other columns."""

from __future__ import annotations

import json
import logging

import pytest

from dispatcher.models import Kind, State, Task
from dispatcher.store.rows import row_to_task, task_to_row


def _row(**columns: object) -> dict[str, object]:
    task = Task(
        id="t1",
        model="demo-chat-api",
        kind=Kind.API,
        queue="api-model:demo-chat-api",
        params={"prompt": "a cat", "n": [1, 2.5, None, True]},
        fingerprint="f" * 64,
        created_at=1.0,
    )
    return {**task_to_row(task), "seq": 7, **columns}


def test_a_row_reads_back_as_written() -> None:
    result = {"text": "ok", "usage": {"tokens": 3}}
    task = row_to_task(_row(state="success", result=json.dumps(result)))
    assert task.params == {"prompt": "a cat", "n": [1, 2.5, None, True]}
    assert task.result == result
    assert task.state is State.SUCCESS and task.kind is Kind.API and task.seq == 7


@pytest.mark.parametrize(
    "stored",
    ['{"prompt": "a cat"', '{"prompt": "a cat"} trailing', "not json", "[1, 2"],
)
def test_a_damaged_json_column_is_shown_empty_and_the_rest_still_reads(
    stored: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        task = row_to_task(_row(id=f"damaged-{len(stored)}", params=stored, state="pending"))
    assert task.params == {}
    assert task.state is State.PENDING and task.fingerprint == "f" * 64
    assert "stored params is not readable JSON" in caplog.text


def test_json_another_writer_spaced_out_still_reads() -> None:
    task = row_to_task(_row(params=' \n{"prompt": "a cat"}\n ', state="pending"))
    assert task.params == {"prompt": "a cat"}


def test_an_unknown_state_is_refused_as_before() -> None:
    with pytest.raises(ValueError, match="'exploded' is not a valid State"):
        row_to_task(_row(state="exploded"))
