"""A gradio app's API, read: pure functions, no I/O (`apirunner.gradio` does that).

- `endpoint_parameters`: the endpoint's parameters from ``/gradio_api/info``.
- `build_data`: a task's params as the endpoint's positional ``data`` list,
  mapped by parameter name; what cannot be sent is a clear `InputError`.
- `SseLines` / `read_event`: the app's event stream (``/gradio_api/queue/data``),
  bounded, turned into `GradioEvent` decisions.
- `output_items`: the finished event's files and texts.

Everything here comes from the app: untrusted, so every read is bounded and
every shape checked.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from dispatcher.errors import InputError

# One event-stream line longer than this ends the attempt (a generating text
# is sent whole each time; 4 MB is far beyond any real one).
MAX_LINE_BYTES = 4 * 1024 * 1024
# Files and texts taken from one result (a gallery is one output of many files).
MAX_OUTPUT_ITEMS = 64
# Longest app error message kept (the rest is the app's traceback noise).
MAX_MESSAGE_CHARS = 500
# What gradio marks a file object with.
FILE_TYPE = "gradio.FileData"


@dataclass(frozen=True)
class Parameter:
    name: str
    has_default: bool
    default: Any
    component: str


def endpoint_parameters(info: Any, api_name: str) -> list[Parameter]:
    """The endpoint's parameters, in order; InputError naming the known endpoints."""
    named = info.get("named_endpoints") if isinstance(info, dict) else None
    if not isinstance(named, dict):
        raise InputError("the app's /gradio_api/info has no named_endpoints")
    endpoint = named.get(api_name)
    if not isinstance(endpoint, dict):
        known = ", ".join(sorted(str(k) for k in named)[:20]) or "none"
        raise InputError(f"the app has no API endpoint {api_name!r}; it has: {known}")
    found: list[Parameter] = []
    raw = endpoint.get("parameters")
    for index, item in enumerate(raw if isinstance(raw, list) else []):
        if not isinstance(item, dict):
            continue
        name = item.get("parameter_name") or item.get("label") or f"param_{index}"
        found.append(
            Parameter(
                name=str(name)[:200],
                has_default=bool(item.get("parameter_has_default")),
                default=item.get("parameter_default"),
                component=str(item.get("component") or "")[:100],
            )
        )
    return found


def check_mapping(parameters: list[Parameter], targets: list[str], api_name: str) -> list[str]:
    """Problems of a profile's mapping against the endpoint (empty: it fits)."""
    names = [p.name for p in parameters]
    problems = [
        f"{api_name} has no parameter {target!r} (its parameters: {', '.join(names) or 'none'})"
        for target in targets
        if target not in names
    ]
    problems += [
        f"{api_name} needs parameter {p.name!r}, which the profile sets nowhere "
        "(map a task param to it in `inputs`, or give it in `values`)"
        for p in parameters
        if not p.has_default and p.name not in targets
    ]
    return problems


def build_data(
    parameters: list[Parameter],
    api_name: str,
    *,
    inputs: dict[str, str],
    values: dict[str, Any],
    images: list[str],
    params: dict[str, Any],
    files: dict[str, Any],
) -> list[Any]:
    """The positional ``data`` list: a task's params, fixed values, files, else defaults.

    `inputs` maps task param -> parameter name; `images` are the parameters
    reference images go to; `files` holds parameter name -> the uploaded file
    object.
    """
    names = {p.name for p in parameters}
    by_target: dict[str, Any] = dict(values)
    for param, target in inputs.items():
        if param in params and params[param] is not None:
            by_target[target] = params[param]
    by_target.update(files)
    unknown = sorted(set(by_target) - names)
    if unknown:
        known = ", ".join(sorted(names)) or "none"
        raise InputError(f"{api_name} has no parameter {unknown[0]!r} (its parameters: {known})")
    # A parameter the profile maps but the task leaves out goes as None (the
    # component's empty value: no reference image); one it never mentions
    # must have a default.
    mapped = {*inputs.values(), *images}
    data: list[Any] = []
    for parameter in parameters:
        if parameter.name in by_target:
            data.append(by_target[parameter.name])
        elif parameter.has_default:
            data.append(parameter.default)
        elif parameter.name in mapped:
            data.append(None)
        else:
            raise InputError(
                f"{api_name} needs parameter {parameter.name!r}, which the profile sets "
                "nowhere (map a task param to it in `inputs`, or give it in `values`)"
            )
    return data


def file_value(path: str, name: str) -> dict[str, Any]:
    """An uploaded file as an endpoint input."""
    return {"path": path, "orig_name": name, "meta": {"_type": FILE_TYPE}}


def uploaded_path(answer: Any) -> str:
    """The server path ``/gradio_api/upload`` gave our one file."""
    if isinstance(answer, list) and answer and isinstance(answer[0], str) and answer[0]:
        return answer[0][:4096]
    raise ValueError("the app's /gradio_api/upload answer names no file")


# -- the event stream ---------------------------------------------------------------


class StreamTooLong(ValueError):
    pass


class SseLines:
    """Bytes of an event stream in, complete ``data:`` payloads out (bounded)."""

    def __init__(self, max_line_bytes: int = MAX_LINE_BYTES) -> None:
        self._buffer = bytearray()
        self._max = max_line_bytes

    def feed(self, chunk: bytes) -> list[str]:
        self._buffer += chunk
        payloads: list[str] = []
        while True:
            end = self._buffer.find(b"\n")
            if end < 0:
                if len(self._buffer) > self._max:
                    raise StreamTooLong(f"an event-stream line over {self._max} bytes")
                return payloads
            line = bytes(self._buffer[:end]).rstrip(b"\r")
            del self._buffer[: end + 1]
            if line.startswith(b"data:"):
                payloads.append(line[5:].strip().decode("utf-8", "replace"))


EventKind = Literal[
    "queued", "started", "progress", "generating", "completed", "failed", "lost", "ignore"
]


@dataclass(frozen=True)
class GradioEvent:
    """What one message means for the task."""

    kind: EventKind
    rank: int | None = None  # events ahead in the app's queue
    eta_s: float | None = None  # the app's estimate, seconds from now
    progress: float | None = None  # percent, as every runner reports it
    output: list[Any] = field(default_factory=list)
    message: str = ""


def read_event(payload: str, event_id: str) -> GradioEvent:
    """One ``data:`` payload of ``/gradio_api/queue/data`` for our event."""
    try:
        msg = json.loads(payload)
    except ValueError:
        return GradioEvent("ignore")
    if not isinstance(msg, dict):
        return GradioEvent("ignore")
    kind = msg.get("msg")
    own = msg.get("event_id")
    if own not in (None, event_id):
        return GradioEvent("ignore")  # another event of a shared session
    if kind == "estimation":
        return GradioEvent(
            "queued", rank=_count(msg.get("rank")), eta_s=_seconds(msg.get("rank_eta"))
        )
    if kind == "process_starts":
        return GradioEvent("started", eta_s=_seconds(msg.get("eta")))
    if kind == "progress":
        return GradioEvent("progress", progress=_progress(msg.get("progress_data")))
    if kind == "process_generating":
        return GradioEvent("generating", output=_data(msg.get("output")))
    if kind == "process_completed":
        output = msg.get("output")
        if msg.get("success") is False:
            return GradioEvent("failed", message=_error_text(output))
        return GradioEvent("completed", output=_data(output))
    if kind == "unexpected_error":
        text = _clip(msg.get("message")) or "unexpected error"
        if msg.get("session_not_found"):
            return GradioEvent("lost", message=text)
        return GradioEvent("failed", message=text)
    return GradioEvent("ignore")  # heartbeat, close_stream, log, ...


def _count(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 10**9:
        return value
    return None


def _seconds(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value < 10**7:
        return float(value)
    return None


def _progress(data: Any) -> float | None:
    """Percent done of the outermost progress bar gradio reports."""
    if not isinstance(data, list) or not data or not isinstance(data[0], dict):
        return None
    unit = data[0]
    share = unit.get("progress")
    if isinstance(share, int | float) and not isinstance(share, bool):
        return min(100.0, max(0.0, 100.0 * float(share)))
    index, length = _count(unit.get("index")), _count(unit.get("length"))
    if index is not None and length:
        return min(100.0, 100.0 * index / length)
    return None


def _data(output: Any) -> list[Any]:
    data = output.get("data") if isinstance(output, dict) else None
    return data if isinstance(data, list) else []


def _clip(value: Any) -> str:
    return value.strip()[:MAX_MESSAGE_CHARS] if isinstance(value, str) else ""


def _error_text(output: Any) -> str:
    if isinstance(output, dict):
        text = _clip(output.get("error")) or _clip(output.get("title"))
        if text:
            return text
    # gradio hides a raised exception's text unless the app shows errors.
    return "the app's function raised an error (the app does not show its text)"


# -- results --------------------------------------------------------------------------


@dataclass(frozen=True)
class OutputFile:
    index: int  # which output of the endpoint
    path: str  # the server's path (for /gradio_api/file=)
    url: str | None
    name: str


@dataclass
class Outputs:
    files: list[OutputFile] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    values: list[Any] = field(default_factory=list)  # numbers, labels: kept in meta


def output_items(data: list[Any]) -> Outputs:
    """Files (any depth: a gallery nests them) and texts of a finished event."""
    out = Outputs()
    for index, item in enumerate(data[:MAX_OUTPUT_ITEMS]):
        if isinstance(item, str):
            out.texts.append(item)
            continue
        before = len(out.files)
        _walk(item, index, out, depth=0)
        if len(out.files) == before and item is not None:
            out.values.append(item)
    return out


def _walk(value: Any, index: int, out: Outputs, depth: int) -> None:
    if depth > 8 or len(out.files) >= MAX_OUTPUT_ITEMS:
        return
    if isinstance(value, dict):
        path = value.get("path")
        if (
            isinstance(path, str)
            and path
            and (value.get("meta", {}) == {"_type": FILE_TYPE} or "orig_name" in value)
        ):
            url = value.get("url")
            name = value.get("orig_name")
            out.files.append(
                OutputFile(
                    index=index,
                    path=path[:4096],
                    url=url[:8192] if isinstance(url, str) else None,
                    name=name[:200] if isinstance(name, str) and name else path.rsplit("/", 1)[-1],
                )
            )
            return
        for item in value.values():
            _walk(item, index, out, depth + 1)
    elif isinstance(value, list):
        for item in value[:MAX_OUTPUT_ITEMS]:
            _walk(item, index, out, depth + 1)


def fn_index(config: Any, api_name: str) -> int | None:
    """The endpoint's function index in ``/config`` (what ``/gradio_api/cancel`` needs)."""
    deps = config.get("dependencies") if isinstance(config, dict) else None
    for dep in deps if isinstance(deps, list) else []:
        if isinstance(dep, dict) and f"/{dep.get('api_name')}" == api_name:
            found = dep.get("id")
            return found if isinstance(found, int) and not isinstance(found, bool) else None
    return None
