"""What a task notice says (PostgreSQL only; heard by `store.pglisten`).

A trigger (migrations `postgresql/0002_task_notify.sql`, `0009`) sends one
from every write that creates a task, changes its state or asks to cancel
it: `{"host" : <writing host>, "row" : <the row as JSON>}`, or, for a row
too long for a notice, `<id> <state> <cancel 0|1> <writing host>`.

Most hosts need only the notice's header from another host's write: which
task, its state, its cancel flag, its provider (a wake-up, a cancel, a
quota's running tasks). Decoding the row (a JSON parse, then the row's own
JSON columns and a `Task`) was ~15 us a notice, and each of three hosts
hears two notices of another host's per task; the header is read from the
row's text by position instead (~3 us), and the row decoded only for who
shows it (`TaskNotice.task()`: the event stream, a login page).

The header is found by keys of the row object itself: PostgreSQL's
`row_to_json` writes them compactly (`,"state":"`), and inside a string
value every `"` is escaped, so no text a user wrote can pose as one. A
notice whose header is not found is decoded whole, as before.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from dispatcher.models import Task
from dispatcher.store.rows import row_to_task

_STRING = r'"(?:[^"\\]|\\.)*"'
_HEAD = re.compile(rf'\{{"host" : ({_STRING}), "row" : \{{"seq":\d+,"id":({_STRING}),')
_STATE = re.compile(r',"state":"([a-z_]+)"')
_CANCEL = re.compile(r',"cancel_requested":(\d+)')
_OWNER = re.compile(rf',"owner":(null|{_STRING})')


@dataclass(frozen=True, slots=True)
class TaskNotice:
    """A task row another host wrote: what changed is in the row itself."""

    task_id: str
    state: str
    cancel_requested: bool
    origin: str  # the host whose write it was
    # The provider (quota owner) of the task, when the notice names it.
    owner: str | None = None
    # The notice's text when it carried the row (most do; a row too long
    # for a notice is read back): `task()` decodes it.
    payload: str | None = None

    @property
    def carries_row(self) -> bool:
        return self.payload is not None

    def task(self) -> Task | None:
        """The row as written; None if the notice did not carry it (or it does not decode)."""
        if self.payload is None:
            return None
        try:
            return row_to_task(json.loads(self.payload)["row"])
        except (ValueError, KeyError, TypeError):
            return None


def parse_notice(payload: str) -> TaskNotice | None:
    """The notice's header (its row left as text), or None if malformed."""
    if payload.startswith("{"):
        return notice_header(payload) or _decoded(payload)
    parts = payload.split(" ", 3)
    if len(parts) < 3:
        return None
    task_id, state, cancel = parts[0], parts[1], parts[2]
    return TaskNotice(
        task_id=task_id,
        state=state,
        cancel_requested=cancel == "1",
        origin=parts[3] if len(parts) == 4 else "",
    )


def notice_header(payload: str) -> TaskNotice | None:
    """The notice read by position alone (see the module); None when its
    layout is not the trigger's."""
    head = _HEAD.match(payload)
    if head is None:
        return None
    rest = head.end()
    state = _STATE.search(payload, rest)
    cancel = _CANCEL.search(payload, rest)
    owner = _OWNER.search(payload, rest)
    if state is None or cancel is None or owner is None:
        return None
    try:
        origin, task_id = _string(head[1]), _string(head[2])
        owned = None if owner[1] == "null" else _string(owner[1])
    except ValueError:
        return None
    return TaskNotice(
        task_id=task_id,
        state=state[1],
        cancel_requested=cancel[1] != "0",
        origin=origin,
        owner=owned,
        payload=payload,
    )


def _string(quoted: str) -> str:
    """A JSON string's value (most hold no escape: no parse needed)."""
    if "\\" not in quoted:
        return quoted[1:-1]
    value = json.loads(quoted)
    if not isinstance(value, str):
        raise ValueError(quoted)
    return value


def _decoded(payload: str) -> TaskNotice | None:
    try:
        body: Any = json.loads(payload)
        task = row_to_task(body["row"])
    except (ValueError, KeyError, TypeError):
        return None
    return TaskNotice(
        task.id,
        task.state.value,
        task.cancel_requested,
        str(body["host"]),
        owner=task.owner,
        payload=payload,
    )


def own_prefix(host: str) -> str:
    """How a row's notice written by `host` starts (`json_build_object`'s
    text, migration 0009). A host whose name PostgreSQL escapes otherwise
    than `json.dumps` is not matched: its notices are decoded and dropped."""
    return f'{{"host" : {json.dumps(host, ensure_ascii=False)}, "row" : '
