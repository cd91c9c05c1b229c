"""`dispatcher check --live` for ComfyUI: a profile's workflows against the
server's own `GET /object_info`. Pure functions over what the server sent
(untrusted: shapes checked, everything bounded).

What fails only at the first task otherwise: a node class the server does
not have (a custom node not installed), a mapped input the node does not
take or that is wired from another node, a literal value of the wrong type
or out of range, a choice not in the list (a checkpoint not installed), a
required input missing, a link from an output of another type.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dispatcher.flows import Flow
from dispatcher.workflow import parse_slot

MAX_PROBLEMS = 50
_SCALARS = {"INT", "FLOAT", "STRING", "BOOLEAN"}


def _spec(info: Mapping[str, Any], class_type: str, name: str) -> list[Any] | None:
    """The input's spec (`["INT", {...}]`, `[[choices]]`, `["MODEL"]`), or None."""
    node = info.get(class_type)
    inputs = node.get("input") if isinstance(node, dict) else None
    if not isinstance(inputs, dict):
        return None
    for group in ("required", "optional"):
        table = inputs.get(group)
        if isinstance(table, dict) and isinstance(table.get(name), list) and table[name]:
            return table[name]  # type: ignore[no-any-return]
    return None


def _choices(spec: list[Any]) -> list[Any] | None:
    if isinstance(spec[0], list):
        return spec[0]
    options = spec[1].get("options") if len(spec) > 1 and isinstance(spec[1], dict) else None
    if spec[0] == "COMBO" and isinstance(options, list):
        return options
    return None


def _link_type(spec: list[Any]) -> str | None:
    """The type an input takes from another node's output (`MODEL`), else None."""
    kind = spec[0]
    if isinstance(kind, str) and kind not in _SCALARS and kind != "COMBO":
        return kind
    return None


def value_problem(spec: list[Any], value: Any) -> str | None:
    """Why `value` does not fit the input's spec; None when it does."""
    choices = _choices(spec)
    if choices is not None:
        if value not in choices:
            shown = ", ".join(map(str, choices[:8])) + (" ..." if len(choices) > 8 else "")
            return f"{value!r} is not one of the server's choices ({shown or 'none'})"
        return None
    kind = spec[0]
    options = spec[1] if len(spec) > 1 and isinstance(spec[1], dict) else {}
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if kind == "INT" and not (number and float(value).is_integer()):
        return f"expects an INT, the workflow has {value!r}"
    if kind == "FLOAT" and not number:
        return f"expects a FLOAT, the workflow has {value!r}"
    if kind == "STRING" and not isinstance(value, str):
        return f"expects a STRING, the workflow has {value!r}"
    if kind == "BOOLEAN" and not isinstance(value, bool):
        return f"expects a BOOLEAN, the workflow has {value!r}"
    if kind in ("INT", "FLOAT") and number:
        low, high = options.get("min"), options.get("max")
        if isinstance(low, int | float) and value < low:
            return f"{value!r} is below the server's minimum {low}"
        if isinstance(high, int | float) and value > high:
            return f"{value!r} is above the server's maximum {high}"
    return None


def check_flow(flow: Flow, info: Any, mapped_said: Mapping[str, str]) -> list[str]:
    """Every problem of one workflow against `/object_info`; [] when it fits.

    `mapped_said`: param -> the place as the profile wrote it (for messages).
    """
    if not isinstance(info, dict) or not info:
        return ["the server's /object_info answer lists no node"]
    problems: list[str] = []
    graph = flow.graph
    for node_id, node in graph.items():
        class_type = node["class_type"]
        where = f"node {node_id} ({class_type})"
        entry = info.get(class_type)
        if not isinstance(entry, dict):
            problems.append(f"{where}: the server has no node class {class_type!r}")
            continue
        required = (
            entry.get("input", {}).get("required") if isinstance(entry.get("input"), dict) else {}
        )
        for name in required if isinstance(required, dict) else {}:
            if name not in node["inputs"]:
                problems.append(f"{where}: required input {name!r} is missing")
        for name, value in node["inputs"].items():
            spec = _spec(info, class_type, name)
            if spec is None:
                continue  # ComfyUI ignores inputs a node does not take
            problem = _input_problem(graph, info, spec, value, flow, node_id, name)
            if problem:
                problems.append(f"{where} input {name}: {problem}")
    for param, place in {**flow.inputs, **flow.images}.items():
        slot = parse_slot(place)
        node = graph[slot.node]
        said = mapped_said.get(param, place)
        if len(slot.path) != 2 or slot.path[0] != "inputs":
            continue
        spec = _spec(info, node["class_type"], slot.path[1])
        if spec is None and isinstance(info.get(node["class_type"]), dict):
            taken = _input_names(info, node["class_type"])
            problems.append(
                f"{param} = {said!r}: {node['class_type']} takes no input {slot.path[1]!r} "
                f"on this server (it takes: {', '.join(taken) or 'none'})"
            )
        elif spec is not None and _link_type(spec) is not None:
            problems.append(
                f"{param} = {said!r}: input {slot.path[1]!r} of {node['class_type']} takes "
                f"{_link_type(spec)} from another node, not a value a task can set"
            )
    return [f"workflow {flow.name}: {p}" for p in problems[:MAX_PROBLEMS]]


def _input_names(info: Mapping[str, Any], class_type: str) -> list[str]:
    inputs = info[class_type].get("input")
    names: list[str] = []
    if isinstance(inputs, dict):
        for group in ("required", "optional"):
            if isinstance(inputs.get(group), dict):
                names.extend(str(n) for n in list(inputs[group])[:40])
    return names


def _input_problem(
    graph: Mapping[str, Any],
    info: Mapping[str, Any],
    spec: list[Any],
    value: Any,
    flow: Flow,
    node_id: str,
    name: str,
) -> str | None:
    wanted = _link_type(spec)
    is_link = isinstance(value, list) and len(value) == 2 and isinstance(value[1], int)
    if is_link:
        source = graph.get(str(value[0]))
        if source is None:
            return f"linked to node {value[0]}, which is not in the workflow"
        outputs = info.get(source["class_type"], {}).get("output")
        if wanted is None or not isinstance(outputs, list) or value[1] >= len(outputs):
            return None  # an unknown source class is reported on its own; a widget as input
        given = outputs[value[1]]
        if given != wanted and "*" not in (given, wanted):
            return f"takes {wanted}, linked to node {value[0]} output {value[1]} ({given})"
        return None
    if wanted is not None:
        return f"takes {wanted} from another node, the workflow has {value!r}"
    place = f"{node_id}.inputs.{name}"
    if place in flow.images.values():
        return None  # replaced by the uploaded reference image
    if _choices(spec) is not None and place in flow.inputs.values():
        return None  # a task gives the choice; the server checks it then
    return value_problem(spec, value)
