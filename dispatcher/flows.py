"""A ComfyUI profile's workflows, with its mapping resolved in each. Pure.

A profile names one workflow (``workflow = "..."``) or several
(``workflows = { txt2img = "...", img2img = "..." }``, a task picks one
with its ``workflow`` param; the first is the default). Its mapping
(``inputs``, ``images``, ``outputs``, ``overridable``) may name a node by id
(``"6.inputs.text"``) or by its title in the UI (``"title:Positive
Prompt.text"``, the node's ``_meta.title``), which survives a re-export
that renumbers the nodes. Titles are resolved here, once per workflow, when
the profile is loaded; a title two nodes share is refused then.

``overridable`` lists node inputs a task may set directly, by the same
place text as the profile (``"title:KSampler.cfg"``), or every input of a
node (``"title:KSampler.*"``): the task's param is named by the place
(``{"title:KSampler.cfg": 6.5}``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dispatcher.errors import InputError
from dispatcher.workflow import (
    Graph,
    WorkflowError,
    check_mapping,
    parse_slot,
    resolve_node,
    resolve_place,
)

WORKFLOW_PARAM = "workflow"


@dataclass(frozen=True)
class Flow:
    """One workflow with every place in node-id form."""

    name: str
    graph: Graph
    inputs: dict[str, str]  # param -> "<id>.inputs.<name>"
    images: dict[str, str]
    outputs: tuple[str, ...] | None  # node ids; None: every output node
    # Resolved overridable places: "<id>.inputs.<name>" or "<id>.inputs.*".
    overridable: tuple[str, ...] = ()
    # The overridable places as the profile wrote them (for messages).
    overridable_said: tuple[str, ...] = field(default_factory=tuple)

    def override_place(self, param: str) -> str | None:
        """Where a task param named by a place goes, if the profile lets tasks set it."""
        if "." not in param:
            return None
        try:
            place = resolve_place(self.graph, param, "")
            slot = parse_slot(place)
        except WorkflowError:
            return None
        if len(slot.path) != 2 or slot.path[0] != "inputs":
            return None
        allowed = place in self.overridable or f"{slot.node}.inputs.*" in self.overridable
        node = self.graph.get(slot.node) or {}
        value = node.get("inputs", {}).get(slot.path[1], _MISSING)
        # A link ([node, slot]) is the graph's wiring, never a task's value.
        if not allowed or value is _MISSING or isinstance(value, list | dict):
            return None
        return place

    def places(self, params: Mapping[str, Any]) -> dict[str, str]:
        """Where each of `params` goes (images excluded: they are uploaded first)."""
        places = dict(self.inputs)
        for name in params:
            if name not in places and name not in self.images:
                place = self.override_place(name)
                if place is not None:
                    places[name] = place
        return places


_MISSING = object()


def build_flows(
    graphs: Mapping[str, Graph],
    *,
    inputs: Mapping[str, str],
    images: Mapping[str, str],
    outputs: Sequence[str] | None,
    overridable: Sequence[str],
    where: str,
) -> dict[str, Flow]:
    """Each workflow's resolved mapping; a `WorkflowError` for anything wrong.

    With one workflow every place must resolve in it. With several, a place
    may be missing from some (an img2img-only reference image), but each
    must resolve in at least one, and an ambiguous title is refused always.
    """
    several = len(graphs) > 1
    flows: dict[str, Flow] = {}
    found: set[str] = set()
    for flow_name, graph in graphs.items():
        label = f"{where} (workflow {flow_name})" if several else where
        resolved: dict[str, dict[str, str]] = {"inputs": {}, "images": {}}
        for kind, mapping in (("inputs", inputs), ("images", images)):
            for param, text in mapping.items():
                try:
                    place = resolve_place(graph, text, f"{label}: {param}")
                    check_mapping(graph, {param: place}, None, label)
                except WorkflowError as exc:
                    if several and "no node" in str(exc) and "ambiguous" not in str(exc):
                        continue  # not in this workflow: the task cannot set it here
                    raise
                resolved[kind][param] = place
                found.add(f"{kind}:{param}")
        flow_outputs = _outputs(graph, outputs, label, several)
        patterns = [(text, _pattern(graph, text, label, several)) for text in overridable]
        flows[flow_name] = Flow(
            flow_name,
            graph,
            resolved["inputs"],
            resolved["images"],
            flow_outputs,
            tuple(p for _, p in patterns if p),
            tuple(text for text, p in patterns if p),
        )
    for kind, mapping in (("inputs", inputs), ("images", images)):
        for param, text in mapping.items():
            if f"{kind}:{param}" not in found:
                raise WorkflowError(f"{where}: {param} = {text!r}: in no workflow of the profile")
    return flows


def _outputs(
    graph: Graph, outputs: Sequence[str] | None, where: str, several: bool
) -> tuple[str, ...] | None:
    if outputs is None:
        return None
    ids: list[str] = []
    for text in outputs:
        try:
            ids.append(resolve_node(graph, text, f"{where}: outputs"))
        except WorkflowError:
            if not several:
                raise
    check_mapping(graph, {}, ids, where)
    if not ids:
        raise WorkflowError(f"{where}: none of outputs {list(outputs)} is in this workflow")
    return tuple(ids)


def _pattern(graph: Graph, text: str, where: str, several: bool) -> str | None:
    node_text, dot, name = text.rpartition(".")
    if not dot or not name:
        raise WorkflowError(f"{where}: overridable {text!r} is not '<node>.<input>' or '<node>.*'")
    try:
        if name == "*":
            node = resolve_node(graph, node_text.removesuffix(".inputs"), f"{where}: overridable")
            return f"{node}.inputs.*"
        place = resolve_place(graph, text, f"{where}: overridable")
        check_mapping(graph, {"overridable": place}, None, where)
    except WorkflowError:
        if several:
            return None
        raise
    return place


def choose(flows: Mapping[str, Flow], params: Mapping[str, Any]) -> Flow:
    """The workflow a task asked for (`workflow` param), else the first."""
    asked = params.get(WORKFLOW_PARAM)
    if asked is None or (len(flows) == 1 and WORKFLOW_PARAM not in params):
        return next(iter(flows.values()))
    if not isinstance(asked, str) or asked not in flows:
        raise InputError(
            f"{WORKFLOW_PARAM}: {asked!r} is not a workflow of this model; "
            f"known: {', '.join(flows)}"
        )
    return flows[asked]


def check_task_params(flows: Mapping[str, Flow], params: Mapping[str, Any]) -> Flow:
    """Refuse at submit what the chosen workflow cannot take; return that workflow.

    Unknown params are listed with the known ones; a reference image the
    workflow loads must be given (ComfyUI would fail on the workflow's
    placeholder file, "Invalid image file: example.png").
    """
    flow = choose(flows, params)
    several = len(flows) > 1
    known = {*flow.inputs, *flow.images, *([WORKFLOW_PARAM] if several else [])}
    unknown = sorted(n for n in params if n not in known and flow.override_place(n) is None)
    if unknown:
        everywhere = sorted({p for f in flows.values() for p in (*f.inputs, *f.images)})
        elsewhere = [n for n in unknown if n in everywhere]
        if elsewhere and several:
            raise InputError(
                f"{', '.join(elsewhere)}: not taken by workflow {flow.name!r}; "
                f"known there: {', '.join(sorted(known))}"
            )
        extra = f"; tasks may also set {', '.join(_said(flow))}" if flow.overridable else ""
        raise InputError(
            f"unknown parameter{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} for this "
            f"workflow; known: {', '.join(sorted(known)) or 'none'}{extra}"
        )
    for name, value in params.items():
        if name != WORKFLOW_PARAM and name not in flow.images and isinstance(value, dict | list):
            raise InputError(f"{name}: expected a string or a number, got {type(value).__name__}")
    missing = [name for name in flow.images if params.get(name) is None]
    if missing:
        name = missing[0]
        raise InputError(
            f"{name} is required: workflow {flow.name!r} loads it at {flow.images[name]}"
            " (give a file path, a data: URL or base64)"
        )
    return flow


def _said(flow: Flow) -> list[str]:
    return list(flow.overridable_said)
