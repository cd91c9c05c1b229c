"""A task notice's header, read by position, says what the whole row says."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from dispatcher.models import State, Task
from dispatcher.store.pgnotice import TaskNotice, notice_header, parse_notice
from dispatcher.store.rows import task_to_row
from tests.support.tasks import api_task

# Text a user or an operator writes, with what JSON escapes and what would
# pose as a key of the row if it were not escaped.
tricky = st.text() | st.sampled_from(
    ['","state":"success","x":"', '\\",\\"cancel_requested\\":1', '"owner":"x"', "\\", '"']
)


def _payload(task: Task, host: str, seq: int) -> str:
    """As the trigger writes it: `json_build_object`'s spacing around
    `row_to_json`'s compact row (seq and id first, as the table's columns)."""
    row = {"seq": seq, **task_to_row(task)}
    text = json.dumps(row, separators=(",", ":"), ensure_ascii=False)
    return f'{{"host" : {json.dumps(host, ensure_ascii=False)}, "row" : {text}}}'


@given(
    prompt=tricky,
    owner=st.none() | tricky,
    host=tricky,
    task_id=tricky,
    state=st.sampled_from(list(State)),
    cancel=st.booleans(),
    seq=st.integers(1, 2**62),
)
def test_the_header_matches_the_decoded_row(
    prompt: str, owner: str | None, host: str, task_id: str, state: State, cancel: bool, seq: int
) -> None:
    task = api_task(
        task_id,
        queue="api-model:m",
        params={"prompt": prompt, "state": "success"},
        fingerprint="fp",
        owner=owner,
        state=state,
        cancel_requested=cancel,
    )
    payload = _payload(task, host, seq)
    notice = notice_header(payload)  # by position, the row not decoded
    assert notice is not None and parse_notice(payload) == notice
    assert notice == TaskNotice(
        task_id, state.value, cancel, host, owner=owner, payload=notice.payload
    )
    decoded = notice.task()
    assert decoded is not None
    assert (decoded.id, decoded.state, decoded.cancel_requested, decoded.owner) == (
        task_id,
        state,
        cancel,
        owner,
    )
    assert decoded.params["prompt"] == prompt


def test_a_notice_without_the_expected_layout_is_decoded_whole() -> None:
    row = {
        **task_to_row(api_task("t1", queue="q", params={}, fingerprint="f")),
        "seq": 3,
    }
    # seq last: not the table's order, so not read by position.
    payload = json.dumps({"host": "h2", "row": row})
    assert notice_header(payload) is None
    notice = parse_notice(payload)
    assert notice is not None and (notice.task_id, notice.state, notice.origin) == (
        "t1",
        "pending",
        "h2",
    )
    assert parse_notice('{"host": "h2", "row": {"id": 1') is None
