"""`dispatcher check --live`: ask each ComfyUI server whether it can run the
profiles' workflows (`apirunner.comfy_check` decides, from its `/object_info`)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from apirunner.comfy_check import check_flow
from apirunner.templates import join_url
from dispatcher.profiles import ApiSpec, Profile

# A real server with many custom nodes answers a few MB; more is not ComfyUI.
MAX_OBJECT_INFO_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class LiveResult:
    profile: str
    server: str
    problems: list[str]
    checked: str = ""  # what was checked, for the ok line


class Unreachable(Exception):
    pass


def fetch_object_info(api: ApiSpec, timeout_s: float) -> Any:
    url = join_url(api.base_url, "/object_info")
    headers = {"Accept": "application/json"}
    token = os.environ.get(api.auth_env) if api.auth_env else None
    if token:
        headers[api.auth_header] = f"{api.auth_prefix}{token}"
    try:
        with (
            httpx.Client(timeout=timeout_s, follow_redirects=False) as client,
            client.stream("GET", url, headers=headers) as response,
        ):
            if response.status_code != 200:
                raise Unreachable(f"GET {url} answered HTTP {response.status_code}")
            body = bytearray()
            for chunk in response.iter_bytes():
                body += chunk
                if len(body) > MAX_OBJECT_INFO_BYTES:
                    raise Unreachable(f"GET {url}: answer over {MAX_OBJECT_INFO_BYTES} bytes")
    except httpx.HTTPError as exc:
        raise Unreachable(f"cannot reach {url}: {type(exc).__name__}: {exc}") from exc
    try:
        return json.loads(bytes(body))
    except ValueError as exc:
        raise Unreachable(f"GET {url}: the answer is not JSON") from exc


def live_check(profiles: Mapping[str, Profile], timeout_s: float) -> list[LiveResult]:
    """Each ComfyUI profile on each of its servers (one `/object_info` per server)."""
    answers: dict[str, Any] = {}
    results: list[LiveResult] = []
    for name, profile in sorted(profiles.items()):
        if profile.api is None or profile.api.style != "comfyui":
            continue
        said = {**profile.api.inputs, **profile.api.images}
        for provider in profile.provider_names:
            api = profile.api_for(provider)
            server = api.base_url
            if server not in answers:
                try:
                    answers[server] = fetch_object_info(api, timeout_s)
                except Unreachable as exc:
                    answers[server] = exc
            info = answers[server]
            if isinstance(info, Unreachable):
                results.append(LiveResult(name, server, [str(info)]))
                continue
            problems = [p for flow in api.flows.values() for p in check_flow(flow, info, said)]
            nodes = sum(len(flow.graph) for flow in api.flows.values())
            checked = f"{len(api.flows)} workflow(s), {nodes} node(s), {len(said)} mapped input(s)"
            results.append(LiveResult(name, server, problems, checked))
    return results
