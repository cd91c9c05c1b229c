"""The demo ComfyUI server's nodes: what `/object_info` lists, how a graph is
validated (ComfyUI's error shapes), and how a prompt "executes".

Execution is a walk from the output nodes, inputs first, as ComfyUI does;
each node's result is cached by its inputs' signature, so an identical graph
runs no node at all and replays the old files (ComfyUI's behaviour, see
COMFYUI-NOTES 5). The sampler takes `steps` ticks of `STEP_S` nominal
seconds each and checks for an interrupt between ticks.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PIL import Image

CHECKPOINTS = ["v1-5-pruned-emaonly.safetensors", "sd_xl_base_1.0.safetensors"]
SAMPLERS = ["euler", "euler_ancestral", "dpmpp_2m", "ddim"]
SCHEDULERS = ["normal", "karras", "exponential", "simple"]
STEP_S = 0.2  # nominal seconds per sampler step
NODE_S = 0.05  # nominal seconds for every other node
MAX_SIDE = 4096
# A prompt containing this word fails in the sampler the first time that
# prompt text runs, and works from then on: a shot failed on purpose.
FAIL_ONCE = "fail-once"


def _int(default: int, lo: int, hi: int) -> list[Any]:
    return ["INT", {"default": default, "min": lo, "max": hi}]


def _float(default: float, lo: float, hi: float) -> list[Any]:
    return ["FLOAT", {"default": default, "min": lo, "max": hi}]


# class_type -> (required inputs, output types, is an output node)
NODES: dict[str, tuple[dict[str, list[Any]], list[str], bool]] = {
    "CheckpointLoaderSimple": ({"ckpt_name": [CHECKPOINTS]}, ["MODEL", "CLIP", "VAE"], False),
    "CLIPTextEncode": (
        {"text": ["STRING", {"multiline": True}], "clip": ["CLIP"]},
        ["CONDITIONING"],
        False,
    ),
    "EmptyLatentImage": (
        {
            "width": _int(512, 16, MAX_SIDE),
            "height": _int(512, 16, MAX_SIDE),
            "batch_size": _int(1, 1, 8),
        },
        ["LATENT"],
        False,
    ),
    "KSampler": (
        {
            "model": ["MODEL"],
            "seed": _int(0, 0, 2**64 - 1),
            "steps": _int(20, 1, 10000),
            "cfg": _float(8.0, 0.0, 100.0),
            "sampler_name": [SAMPLERS],
            "scheduler": [SCHEDULERS],
            "positive": ["CONDITIONING"],
            "negative": ["CONDITIONING"],
            "latent_image": ["LATENT"],
            "denoise": _float(1.0, 0.0, 1.0),
        },
        ["LATENT"],
        False,
    ),
    "VAEDecode": ({"samples": ["LATENT"], "vae": ["VAE"]}, ["IMAGE"], False),
    # The choices of `image` are the files in the input dir, listed when asked.
    "LoadImage": ({"image": [[]]}, ["IMAGE", "MASK"], False),
    "VAEEncode": ({"pixels": ["IMAGE"], "vae": ["VAE"]}, ["LATENT"], False),
    "SaveImage": ({"images": ["IMAGE"], "filename_prefix": ["STRING", {}]}, [], True),
    "PreviewImage": ({"images": ["IMAGE"]}, [], True),
}


def _required(class_type: str, input_files: list[str]) -> dict[str, list[Any]]:
    required = NODES[class_type][0]
    if class_type == "LoadImage":
        return {**required, "image": [input_files]}
    return required


# What ComfyUI's SaveImage asks for besides its inputs (server.py's node_info).
_HIDDEN = {"SaveImage": {"prompt": "PROMPT", "extra_pnginfo": "EXTRA_PNGINFO"}}


def node_info(name: str, input_files: list[str]) -> dict[str, Any]:
    """One node as ComfyUI's `GET /object_info` describes it (server.py's node_info)."""
    _, outputs, is_output = NODES[name]
    required = _required(name, input_files)
    hidden = _HIDDEN.get(name, {})
    return {
        "input": {"required": required, **({"hidden": hidden} if hidden else {})},
        "input_order": {"required": list(required), **({"hidden": list(hidden)} if hidden else {})},
        "output": outputs,
        "output_is_list": [False] * len(outputs),
        "output_name": outputs,
        "name": name,
        "display_name": name,
        "description": "",
        "python_module": "nodes",
        "category": "demo",
        "output_node": is_output,
    }


def object_info(input_files: list[str]) -> dict[str, Any]:
    return {name: node_info(name, input_files) for name in NODES}


def _node_error(kind: str, message: str, details: str, name: str) -> dict[str, Any]:
    return {
        "type": kind,
        "message": message,
        "details": details,
        "extra_info": {"input_name": name},
    }


def _check_input(
    graph: dict[str, Any], name: str, spec: list[Any], value: Any
) -> dict[str, Any] | None:
    kind = spec[0]
    if isinstance(kind, str) and kind.isupper() and kind not in ("INT", "FLOAT", "STRING"):
        ok = (
            isinstance(value, list)
            and len(value) == 2
            and str(value[0]) in graph
            and isinstance(value[1], int)
        )
        if not ok:
            return _node_error(
                "bad_linked_input",
                "Bad linked input, must be a length-2 list of [node_id, slot_index]",
                f"{name}, {value}",
                name,
            )
        source = NODES.get(graph[str(value[0])].get("class_type"), ({}, [], False))[1]
        if value[1] >= len(source) or source[value[1]] != kind:
            return _node_error("return_type_mismatch", "Return type mismatch", name, name)
        return None
    if isinstance(kind, list):
        if value not in kind:
            return _node_error(
                "value_not_in_list", "Value not in list", f"{name}: '{value}' not in {kind}", name
            )
        return None
    if kind == "STRING":
        if not isinstance(value, str):
            return _node_error(
                "invalid_input_type",
                "Failed to convert an input value to a STRING value",
                name,
                name,
            )
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return _node_error(
            "invalid_input_type",
            f"Failed to convert an input value to a {kind} value",
            f"{name}, {value}",
            name,
        )
    limits = spec[1]
    if value < limits["min"]:
        return _node_error(
            "value_smaller_than_min",
            f"Value {value} smaller than min of {limits['min']}",
            f"{name}",
            name,
        )
    if value > limits["max"]:
        return _node_error(
            "value_bigger_than_max",
            f"Value {value} bigger than max of {limits['max']}",
            f"{name}",
            name,
        )
    return None


def validate(
    graph: Any, input_files: list[str]
) -> tuple[dict[str, Any] | None, dict[str, Any], list[str]]:
    """(top-level error or None, node_errors, output node ids that will run)."""
    if not isinstance(graph, dict):
        return _top("invalid_prompt", "Invalid prompt: not an object of nodes", ""), {}, []
    for node_id, node in graph.items():
        class_type = node.get("class_type") if isinstance(node, dict) else None
        if class_type not in NODES:
            return (
                _top(
                    "missing_node_type", f"Node '{class_type}' not found.", f"Node ID '#{node_id}'"
                ),
                {},
                [],
            )
    outputs = [nid for nid, node in graph.items() if NODES[node["class_type"]][2]]
    if not outputs:
        return _top("prompt_no_outputs", "Prompt has no outputs", ""), {}, []
    node_errors: dict[str, Any] = {}
    for node_id, node in graph.items():
        inputs = node.get("inputs") if isinstance(node.get("inputs"), dict) else {}
        errors = []
        for name, spec in _required(node["class_type"], input_files).items():
            if name not in inputs:
                errors.append(
                    _node_error("required_input_missing", "Required input is missing", name, name)
                )
                continue
            problem = _check_input(graph, name, spec, inputs[name])
            if problem is not None:
                errors.append(problem)
        if errors:
            node_errors[node_id] = {
                "errors": errors,
                "dependent_outputs": [],
                "class_type": node["class_type"],
            }
    good = []
    for out in outputs:
        upstream = _upstream(graph, out)
        failing = [nid for nid in upstream if nid in node_errors]
        for nid in failing:
            node_errors[nid]["dependent_outputs"].append(out)
        if not failing:
            good.append(out)
    if not good:
        # The detail of a fault upstream of an output is only in node_errors.
        return (
            _top("prompt_outputs_failed_validation", "Prompt outputs failed validation", ""),
            node_errors,
            [],
        )
    return None, node_errors, good


def _top(kind: str, message: str, details: str) -> dict[str, Any]:
    return {"type": kind, "message": message, "details": details, "extra_info": {}}


def _upstream(graph: dict[str, Any], node_id: str) -> list[str]:
    seen: list[str] = []
    stack = [node_id]
    while stack:
        nid = stack.pop()
        if nid in seen or nid not in graph:
            continue
        seen.append(nid)
        for value in graph[nid].get("inputs", {}).values():
            if isinstance(value, list) and len(value) == 2:
                stack.append(str(value[0]))
    return seen


def render_png(
    text: str, negative: str, seed: int, size: tuple[int, int], source: str, index: int
) -> bytes:
    """A real PNG whose pixels depend on the prompt text, the seed and the
    reference image (`source`, its digest; "" for txt2img)."""
    width, height = size
    material = f"{text}\0{negative}\0{seed}\0{source}\0{index}".encode()
    pixels = b""
    block = hashlib.sha256(material).digest()
    while len(pixels) < 8 * 8 * 3:
        pixels += block
        block = hashlib.sha256(block).digest()
    img = Image.frombytes("RGB", (8, 8), pixels[: 8 * 8 * 3]).resize(
        (min(width, 1024), min(height, 1024)), Image.Resampling.NEAREST
    )
    out = io.BytesIO()
    img.save(out, format="PNG")
    return out.getvalue()


class Interrupted(Exception):
    def __init__(self, node_id: str, node_type: str) -> None:
        super().__init__(node_id)
        self.node_id = node_id
        self.node_type = node_type


class NodeFailed(Exception):
    def __init__(self, node_id: str, node_type: str, exc_type: str, message: str) -> None:
        super().__init__(message)
        self.node_id = node_id
        self.node_type = node_type
        self.exc_type = exc_type
        self.message = message


Send = Callable[[str, dict[str, Any]], Awaitable[None]]
Tick = Callable[[float, str, str], Awaitable[None]]  # sleep nominal s; raises Interrupted


@dataclass
class Outputs:
    """Where files go and the node cache, shared by every prompt of the server."""

    root: Path
    counters: dict[str, int] = field(default_factory=dict)
    cache: dict[str, tuple[Any, dict[str, Any] | None]] = field(default_factory=dict)
    failed_once: set[str] = field(default_factory=set)

    def save(self, prefix: str, data: bytes, kind: str) -> dict[str, str]:
        subfolder, _, base = prefix.rpartition("/")
        if ".." in prefix.split("/") or prefix.startswith("/"):
            raise NodeFailed("", "SaveImage", "ValueError", "filename_prefix leaves the output dir")
        folder = self.root / kind / subfolder
        folder.mkdir(parents=True, exist_ok=True)
        key = f"{kind}/{prefix}"
        number = self.counters.get(key, 0) + 1
        self.counters[key] = number
        name = f"{base or 'ComfyUI'}_{number:05d}_.png"
        (folder / name).write_bytes(data)
        return {"filename": name, "subfolder": subfolder, "type": kind}


async def execute(
    graph: dict[str, Any], outputs: list[str], store: Outputs, send: Send, tick: Tick
) -> tuple[dict[str, Any], list[str]]:
    """Run the prompt; the `ui` outputs by node id, and the nodes that ran."""
    values: dict[str, Any] = {}
    signatures: dict[str, str] = {}
    ui: dict[str, Any] = {}
    ran: list[str] = []

    def signature(nid: str) -> str:
        if nid not in signatures:
            node = graph[nid]
            parts = {
                k: signature(str(v[0])) + f":{v[1]}" if isinstance(v, list) else v
                for k, v in node["inputs"].items()
            }
            signatures[nid] = hashlib.sha256(
                json.dumps([node["class_type"], parts], sort_keys=True).encode()
            ).hexdigest()
        return signatures[nid]

    order: list[str] = []

    visiting: set[str] = set()

    def visit(nid: str) -> None:  # inputs first, each node once
        if nid in order:
            return
        if nid in visiting:
            raise NodeFailed(nid, graph[nid]["class_type"], "ValueError", "the graph has a cycle")
        visiting.add(nid)
        for value in graph[nid]["inputs"].values():
            if isinstance(value, list):
                visit(str(value[0]))
        order.append(nid)

    for out in outputs:
        visit(out)
    cached = [nid for nid in order if signature(nid) in store.cache]
    await send("execution_cached", {"nodes": cached})
    for nid in order:
        node = graph[nid]
        if nid in cached:
            values[nid], shown = store.cache[signature(nid)]
            if shown is not None:
                ui[nid] = shown
                await send("executed", {"node": nid, "display_node": nid, "output": shown})
            continue
        await send("executing", {"node": nid, "display_node": nid})
        args = {
            k: values[str(v[0])][v[1]] if isinstance(v, list) else v
            for k, v in node["inputs"].items()
        }
        values[nid], shown = await _run_node(nid, node["class_type"], args, store, send, tick)
        ran.append(nid)
        store.cache[signature(nid)] = (values[nid], shown)
        if shown is not None:
            ui[nid] = shown
            await send("executed", {"node": nid, "display_node": nid, "output": shown})
    return ui, ran


async def _run_node(
    nid: str, class_type: str, args: dict[str, Any], store: Outputs, send: Send, tick: Tick
) -> tuple[Any, dict[str, Any] | None]:
    if class_type == "KSampler":
        text = str(args["positive"])
        if FAIL_ONCE in text and text not in store.failed_once:
            await tick(NODE_S, nid, class_type)
            store.failed_once.add(text)
            raise NodeFailed(
                nid, class_type, "RuntimeError", "demo: this shot fails once on purpose (fail-once)"
            )
        steps = int(args["steps"])
        for step in range(1, steps + 1):
            await tick(STEP_S, nid, class_type)
            await send("progress", {"value": step, "max": steps, "node": nid})
        width, height, batch, source = args["latent_image"]
        sampled = (text, str(args["negative"]), int(args["seed"]), (width, height), source, batch)
        return [sampled], None
    await tick(NODE_S, nid, class_type)
    if class_type == "CheckpointLoaderSimple":
        return ["model", "clip", "vae"], None
    if class_type == "CLIPTextEncode":
        return [str(args["text"])], None
    if class_type == "EmptyLatentImage":
        return [(int(args["width"]), int(args["height"]), int(args["batch_size"]), "")], None
    if class_type == "LoadImage":
        data = (store.root / "input" / str(args["image"])).read_bytes()
        with Image.open(io.BytesIO(data)) as img:
            size = img.size
        return [(size, hashlib.sha256(data).hexdigest()), "mask"], None
    if class_type == "VAEEncode":
        (width, height), source = args["pixels"]
        return [(width, height, 1, source)], None
    if class_type == "VAEDecode":
        return [args["samples"]], None
    text, negative, seed, size, source, batch = args["images"]
    kind = "output" if class_type == "SaveImage" else "temp"
    prefix = str(args.get("filename_prefix", "ComfyUI")) if kind == "output" else "ComfyUI_temp"
    images = [
        store.save(prefix, render_png(text, negative, seed, size, source, i), kind)
        for i in range(batch)
    ]
    return [], {"images": images}
