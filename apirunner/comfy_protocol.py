"""What ComfyUI's answers and messages mean. Pure functions.

Everything here reads untrusted input: shapes are checked, lists bounded,
texts cut, and anything unknown is skipped rather than trusted (newer
servers add message types and fields; COMFYUI-NOTES 10).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from apirunner.classify import Failure

MAX_FILES = 200  # files collected from one prompt
MAX_TEXT = 300
# An out-of-memory failure depends on what else the GPU was doing: worth
# another attempt. Every other node exception comes from the graph itself.
# Decided from ComfyUI's structured `exception_type` (the exception's
# qualified class name) first; the message only counts as whole phrases, so
# "zoom", "room" or "boom" never read as "oom".
_TRANSIENT_EXCEPTIONS = frozenset(
    {"OutOfMemoryError", "MemoryError", "ConnectionError", "ConnectionResetError"}
)
_TRANSIENT_PHRASES = re.compile(r"\b(?:cuda out of memory|out of memory|cuda error)\b", re.I)


def transient_node_failure(exception_type: str, message: str) -> bool:
    """Whether a node's exception depends on the machine rather than the graph."""
    name = exception_type.rsplit(".", 1)[-1].strip()
    return name in _TRANSIENT_EXCEPTIONS or bool(_TRANSIENT_PHRASES.search(message))


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _text(value: Any, limit: int = MAX_TEXT) -> str:
    if value is None:
        return ""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    # ComfyUI's messages often end in a newline (tracebacks): it would split a log line.
    return text.strip()[:limit]


# -- submit ----------------------------------------------------------------------
def _node_error_lines(node_errors: Any) -> list[str]:
    lines: list[str] = []
    if not isinstance(node_errors, dict):
        return lines
    for node_id, entry in list(node_errors.items())[:20]:
        if not isinstance(entry, dict):
            continue
        class_type = _text(entry.get("class_type"), 80)
        errors = _list(entry.get("errors"))
        for err in errors[:10]:
            if not isinstance(err, dict):
                continue
            extra = _dict(err.get("extra_info"))
            name = _text(extra.get("input_name"), 80)
            where = f"node {_text(node_id, 40)} ({class_type})" + (f" input {name}" if name else "")
            detail = _text(err.get("details"), 160)
            message = _text(err.get("message"), 160)
            lines.append(
                f"{where}: {message}" + (f" [{detail}]" if detail and detail != name else "")
            )
    return lines


def describe_rejection(body: str) -> str:
    """A refused `/prompt` (400, or node_errors in a 200): which node, which input, why."""
    try:
        data = json.loads(body) if body.strip() else None
    except ValueError:
        data = None
    if not isinstance(data, dict):
        return f"ComfyUI refused the workflow: {_text(body.strip()) or 'no reason given'}"
    error = data.get("error")
    if isinstance(error, dict):
        head = _text(error.get("message"), 160) or _text(error.get("type"), 80)
        details = _text(error.get("details"), 160)
    else:
        head, details = _text(error, 160), ""
    lines = _node_error_lines(data.get("node_errors"))
    text = f"ComfyUI refused the workflow: {head or 'no reason given'}"
    if lines:
        text += "; " + "; ".join(lines)
    elif details:
        text += f" ({details})"  # e.g. "Node ID '#5'" for an unknown class_type
    return text[:1000]


def failing_outputs(node_errors: Any) -> set[str]:
    """Output nodes that will not run, from a 200 answer's node_errors."""
    found: set[str] = set()
    if isinstance(node_errors, dict):
        for entry in node_errors.values():
            outs = entry.get("dependent_outputs") if isinstance(entry, dict) else None
            if isinstance(outs, list):
                found.update(str(o) for o in outs[:50])
    return found


# -- where the prompt is ---------------------------------------------------------
Place = Literal["pending", "running", "absent"]


@dataclass(frozen=True)
class QueueSpot:
    place: Place
    ahead: int | None = None  # prompts the server will run before ours


def queue_spot(answer: Any, prompt_id: str) -> QueueSpot:
    """Our prompt in a `GET /queue` answer (items are [number, id, ...] lists)."""
    if not isinstance(answer, dict):
        return QueueSpot("absent")
    running = _list(answer.get("queue_running"))
    pending = _list(answer.get("queue_pending"))

    def ident(item: Any) -> str | None:
        ok = isinstance(item, list) and len(item) >= 2 and isinstance(item[1], str)
        return item[1] if ok else None

    if any(ident(item) == prompt_id for item in running):
        return QueueSpot("running", 0)
    # The server answers in heap order; the order of execution is by number.
    numbered = [
        (item[0], ident(item))
        for item in pending
        if ident(item) is not None and isinstance(item[0], int | float)
    ]
    numbered.sort(key=lambda pair: pair[0])
    for index, (_, pid) in enumerate(numbered):
        if pid == prompt_id:
            return QueueSpot("pending", len(running) + index)
    return QueueSpot("absent")


# -- how it ended ----------------------------------------------------------------
Ending = Literal["success", "failed", "interrupted"]


@dataclass(frozen=True)
class Outcome:
    ending: Ending
    failure: Failure | None = None


def execution_failure(data: Any) -> Failure:
    """An `execution_error` (message or history entry): which node failed, and how."""
    data = data if isinstance(data, dict) else {}
    node = _text(data.get("node_id"), 40) or "?"
    node_type = _text(data.get("node_type"), 80)
    kind = _text(data.get("exception_type"), 80)
    # ComfyUI keeps the traceback's trailing newline: cut, or it splits a log line.
    message = _text(data.get("exception_message"), 240).strip()
    where = f"node {node}" + (f" ({node_type})" if node_type else "")
    text = f"ComfyUI failed at {where}: {kind + ': ' if kind else ''}{message or 'no message'}"
    return Failure(transient_node_failure(kind, message), "node_failed", text)


def read_outcome(entry: Any) -> Outcome:
    """A history entry's ending. An entry exists only once the prompt ended."""
    status = entry.get("status") if isinstance(entry, dict) else None
    if not isinstance(status, dict):
        # Servers from before the `status` field wrote history only on success.
        return Outcome("success")
    messages = _list(status.get("messages"))
    for message in messages[-50:]:
        if not (isinstance(message, list) and len(message) == 2):
            continue
        if message[0] == "execution_error":
            return Outcome("failed", execution_failure(message[1]))
        if message[0] == "execution_interrupted":
            return Outcome("interrupted")
    if status.get("status_str") == "success" or status.get("completed") is True:
        return Outcome("success")
    return Outcome("failed", Failure(True, "node_failed", "ComfyUI reports an error, no detail"))


@dataclass(frozen=True)
class OutputFile:
    node: str
    filename: str
    subfolder: str
    type: str


def output_files(entry: Any, chosen: tuple[str, ...] | None) -> list[OutputFile]:
    """Every file of the chosen output nodes (all nodes when None), in node order."""
    outputs = entry.get("outputs") if isinstance(entry, dict) else None
    if not isinstance(outputs, dict):
        return []
    found: list[OutputFile] = []
    for node, shown in outputs.items():
        if (chosen is not None and node not in chosen) or not isinstance(shown, dict):
            continue
        for items in shown.values():  # "images", "gifs", "audio", ...
            if not isinstance(items, list):
                continue
            for item in items:
                if not (isinstance(item, dict) and isinstance(item.get("filename"), str)):
                    continue
                sub, kind = item.get("subfolder", ""), item.get("type", "output")
                found.append(
                    OutputFile(
                        node,
                        item["filename"][:255],
                        sub[:255] if isinstance(sub, str) else "",
                        kind[:20] if isinstance(kind, str) else "output",
                    )
                )
                if len(found) >= MAX_FILES:
                    return found
    return found


# -- websocket messages ----------------------------------------------------------
@dataclass(frozen=True)
class Event:
    """One websocket message about our prompt, reduced to what the runner uses."""

    kind: Literal["started", "progress", "node", "ended", "error", "interrupted"]
    progress: float | None = None  # percent
    data: Any = None


def read_message(raw: str | bytes, prompt_id: str) -> Event | None:
    """Our prompt's event in one message; None for anything else (other
    prompts, `status`, binary previews, types this code does not know)."""
    if not isinstance(raw, str):
        return None
    try:
        message = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(message, dict) or not isinstance(message.get("data"), dict):
        return None
    kind, data = message.get("type"), message["data"]
    if data.get("prompt_id") != prompt_id:
        return None
    if kind == "execution_start":
        return Event("started", 0.0)
    if kind == "progress":
        value, maximum = data.get("value"), data.get("max")
        numbers = all(
            isinstance(v, int | float) and not isinstance(v, bool) for v in (value, maximum)
        )
        if numbers and maximum > 0:
            return Event("progress", min(100.0, max(0.0, 100.0 * value / maximum)))
        return None
    if kind == "executing":
        node = data.get("node")
        return Event("ended") if node is None else Event("node", data=_text(node, 40))
    if kind == "execution_error":
        return Event("error", data=data)
    if kind == "execution_interrupted":
        return Event("interrupted")
    return None
