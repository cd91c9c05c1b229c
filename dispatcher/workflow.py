"""ComfyUI workflows: loading one, and filling a task's parameters into it.

Pure functions (apart from reading the workflow file once, at profile load).

A workflow is ComfyUI's *API format*: ``{"<node id>": {"class_type": ...,
"inputs": {...}}, ...}``, what the UI's "Export (API)" writes. A profile maps
task parameters to places in it with ``"<node id>.inputs.<name>"``; the
filled-in graph is what is sent to the server and what the fingerprint
covers, so two shots that would render the same graph are the same
generation.
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dispatcher.errors import InputError

Graph = dict[str, Any]

# The largest seed ComfyUI's samplers take is 2**64-1; ours stay below 2**53
# so the number survives every JSON reader unchanged (JavaScript included).
MAX_RANDOM_SEED = 2**53 - 1
SEED_PARAM = "seed"


class WorkflowError(ValueError):
    """The workflow file or the profile's mapping into it is unusable."""


@dataclass(frozen=True)
class Slot:
    """Where one parameter goes: node `node`, then the keys of `path` inside it."""

    node: str
    path: tuple[str, ...]

    def __str__(self) -> str:
        return ".".join((self.node, *self.path))


def parse_slot(text: str) -> Slot:
    parts = text.split(".")
    if len(parts) < 2 or not all(parts):
        raise WorkflowError(f"{text!r} is not '<node id>.inputs.<name>'")
    return Slot(parts[0], tuple(parts[1:]))


TITLE_PREFIX = "title:"


def resolve_node(graph: Graph, text: str, where: str) -> str:
    """A node id from an id or ``"title:<the node's title>"`` (its ``_meta.title``).

    A title is a name the user gave in the UI; it survives a re-export that
    renumbers the nodes. Two nodes of one title make it ambiguous: refused.
    """
    if not text.startswith(TITLE_PREFIX):
        return text
    title = text.removeprefix(TITLE_PREFIX)
    found = [
        node_id
        for node_id, node in graph.items()
        if isinstance(node, dict)
        and isinstance(node.get("_meta"), dict)
        and node["_meta"].get("title") == title
    ]
    if not found:
        raise WorkflowError(f"{where}: the workflow has no node titled {title!r}")
    if len(found) > 1:
        raise WorkflowError(
            f"{where}: the title {title!r} is ambiguous: nodes {', '.join(found)} have it; "
            "rename one in ComfyUI or name the node by id"
        )
    return found[0]


def resolve_place(graph: Graph, text: str, where: str) -> str:
    """``"title:Positive Prompt.text"`` as ``"<id>.inputs.text"``; an id form as is."""
    if not text.startswith(TITLE_PREFIX):
        return text
    title, dot, name = text.rpartition(".")
    if not dot or not name or title == TITLE_PREFIX.rstrip(":") or title == TITLE_PREFIX:
        raise WorkflowError(f"{where}: {text!r} is not 'title:<node title>.<input name>'")
    return f"{resolve_node(graph, title, where)}.inputs.{name}"


def load_workflow(path: Path) -> Graph:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise WorkflowError(f"cannot read workflow {path}: {exc.strerror}") from exc
    except ValueError as exc:
        raise WorkflowError(f"workflow {path} is not JSON: {exc}") from exc
    check_graph(data, str(path))
    return data  # type: ignore[no-any-return]  # check_graph proved its shape


def check_graph(data: Any, where: str) -> None:
    if isinstance(data, dict) and "nodes" in data and "links" in data:
        raise WorkflowError(
            f"workflow {where} is in ComfyUI's UI format; export it with 'Export (API)'"
        )
    if not isinstance(data, dict) or not data:
        raise WorkflowError(f"workflow {where} must be a JSON object of nodes")
    for node_id, node in data.items():
        if not isinstance(node, dict) or not isinstance(node.get("class_type"), str):
            raise WorkflowError(f"workflow {where}: node {node_id!r} has no class_type")
        if not isinstance(node.get("inputs"), dict):
            raise WorkflowError(f"workflow {where}: node {node_id!r} has no inputs object")


def check_mapping(
    graph: Graph, places: Mapping[str, str], outputs: Sequence[str] | None, where: str
) -> None:
    """Every mapped place exists in the graph (the value there is the default)."""
    for param, text in places.items():
        try:
            slot = parse_slot(text)
        except WorkflowError as exc:
            raise WorkflowError(f"{where}: {param} = {exc}") from None
        node = graph.get(slot.node)
        if node is None:
            raise WorkflowError(
                f"{where}: {param} = {text!r}: the workflow has no node {slot.node}"
            )
        parent = node
        for key in slot.path[:-1]:
            parent = parent.get(key) if isinstance(parent, dict) else None
        if not isinstance(parent, dict) or slot.path[-1] not in parent:
            raise WorkflowError(
                f"{where}: {param} = {text!r}: node {slot.node} "
                f"({node['class_type']}) has no {'.'.join(slot.path)}"
            )
    for node_id in outputs or ():
        if node_id not in graph:
            raise WorkflowError(f"{where}: outputs names node {node_id!r}, not in the workflow")


def known_params(inputs: Mapping[str, str], images: Mapping[str, str]) -> list[str]:
    return sorted({*inputs, *images})


def check_params(
    params: Mapping[str, Any], inputs: Mapping[str, str], images: Mapping[str, str]
) -> None:
    unknown = sorted(set(params) - set(inputs) - set(images))
    if unknown:
        raise InputError(
            f"unknown parameter{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} for this "
            f"workflow; known: {', '.join(known_params(inputs, images)) or 'none'}"
        )
    for name, value in params.items():
        if name in inputs and isinstance(value, dict | list):
            raise InputError(f"{name}: expected a string or a number, got {type(value).__name__}")


def with_seed(
    params: Mapping[str, Any], inputs: Mapping[str, str], rng: random.Random
) -> dict[str, Any]:
    """`params`, plus a random seed when the workflow takes one and none was given.

    The seed is chosen once, when the task is created, and stored in its
    params: every attempt renders the same image, and a retry reproduces it.
    """
    if SEED_PARAM in inputs and params.get(SEED_PARAM) is None:
        return {**params, SEED_PARAM: rng.randint(0, MAX_RANDOM_SEED)}
    return dict(params)


def fill(graph: Graph, places: Mapping[str, str], values: Mapping[str, Any]) -> Graph:
    """A copy of `graph` with each value put where its place says.

    A value whose place holds a number is converted to that number's type
    (``"30"`` for an INT input is 30), so a parameter typed in a CSV lands as
    the server expects it; text that is not a number is an `InputError`.
    """
    filled = copy.deepcopy(graph)
    for name, value in values.items():
        if name not in places or value is None:
            continue  # null leaves the workflow's own value
        slot = parse_slot(places[name])
        parent = filled[slot.node]
        for key in slot.path[:-1]:
            parent = parent[key]
        parent[slot.path[-1]] = _like(parent[slot.path[-1]], value, name)
    return filled


def _like(current: Any, value: Any, name: str) -> Any:
    if isinstance(current, bool) or not isinstance(current, int | float):
        return value
    if isinstance(value, bool):
        raise InputError(f"{name}: expected a number, got {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise InputError(f"{name}: expected a number, got {value!r}") from None
    if isinstance(current, int):
        if not number.is_integer():
            raise InputError(f"{name}: expected a whole number, got {value!r}")
        return int(number)
    return number
