"""`dispatcher check --live` for gradio profiles: ask each app whether the
profile's mapping fits its endpoint, before the first task finds out.

One ``GET /gradio_api/info`` per provider of each ``style = "gradio"``
profile (with the token, when the profile names one), its answer bounded;
the endpoint must exist, every parameter the profile names must be one of
its parameters, and every parameter without a default must be set.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

import httpx

from apirunner.gradio_events import check_mapping, endpoint_parameters
from apirunner.templates import join_url
from dispatcher import fetch
from dispatcher.errors import DispatcherError, InputError
from dispatcher.profiles import ApiSpec, Profile

# /gradio_api/info of a large app is tens of KB.
MAX_INFO_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class LiveProblem:
    profile: str
    provider: str
    why: str


async def check_gradio_live(
    profiles: Mapping[str, Profile], *, timeout_s: float = 10.0
) -> tuple[list[str], list[LiveProblem]]:
    """(profiles checked, problems found) for every gradio profile and provider."""
    checked: list[str] = []
    problems: list[LiveProblem] = []
    async with httpx.AsyncClient(timeout=timeout_s, follow_redirects=False) as client:
        for name, profile in sorted(profiles.items()):
            if profile.api is None or profile.api.style != "gradio":
                continue
            checked.append(name)
            for provider in profile.provider_names:
                api = profile.api_for(provider)
                for why in await _check_one(client, api):
                    problems.append(LiveProblem(name, provider, why))
    return checked, problems


async def _check_one(client: httpx.AsyncClient, api: ApiSpec) -> list[str]:
    url = join_url(api.base_url, "/gradio_api/info")
    headers = {"Accept": "application/json"}
    token = os.environ.get(api.auth_env) if api.auth_env else None
    if api.auth_env and not token:
        return [f"${api.auth_env} is not set (the app's token)"]
    if token:
        headers[api.auth_header] = f"{api.auth_prefix}{token}"
    try:
        async with client.stream("GET", url, headers=headers) as response:
            if response.status_code != 200:
                text = await fetch.read_error_text(response)
                return [f"GET {url}: HTTP {response.status_code}: {text[:200]}"]
            body = await fetch.read_capped(response, MAX_INFO_BYTES, f"GET {url}")
        info = fetch.decode_json(body)
    except (TimeoutError, httpx.HTTPError) as exc:
        return [f"GET {url}: {type(exc).__name__}: {exc}"[:300]]
    except (ValueError, DispatcherError) as exc:  # not JSON, too large
        return [f"GET {url}: not the gradio API's answer: {exc}"[:300]]
    assert api.api_name is not None
    try:
        parameters = endpoint_parameters(info, api.api_name)
    except InputError as exc:
        return [str(exc)]
    targets = [*api.inputs.values(), *api.images.values(), *api.values]
    return check_mapping(parameters, targets, api.api_name)
