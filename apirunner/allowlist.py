"""The outbound allowlist: requests go only to hosts named in the profiles.

Built once from the `base_url` of every loaded API profile. URLs a provider
hands back (fal's status and result URLs, CDN links) are checked the same
way, so a compromised or confused provider cannot steer the runner, and the
API key it carries, anywhere else. The check runs before the connection is
opened, so a refused host receives not a single byte.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import httpx

from dispatcher.errors import HostNotAllowed
from dispatcher.profiles import Profile

_DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True)
class Origin:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def origin_of(url: str | httpx.URL) -> Origin | None:
    """Host and effective port; None for URLs that name no host or odd schemes."""
    if isinstance(url, httpx.URL):
        return _origin(url)
    return _origin_of_text(url)


# Every request checks its URL two or three times (allowlist, key scope) and
# most URLs repeat (a chat endpoint, a status URL polled many times); parsing
# one with httpx costs more than the rest of the check together.
@functools.lru_cache(maxsize=256)
def _origin_of_text(url: str) -> Origin | None:
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError, ValueError):
        return None
    return _origin(parsed)


def _origin(parsed: httpx.URL) -> Origin | None:
    scheme = parsed.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not parsed.host:
        return None
    return Origin(parsed.host.lower().rstrip("."), parsed.port or _DEFAULT_PORTS[scheme])


def _describe(url: str | httpx.URL) -> str:
    try:
        parsed = url if isinstance(url, httpx.URL) else httpx.URL(url)
    except (httpx.InvalidURL, TypeError, ValueError):
        return repr(str(url))
    if not parsed.host:
        return repr(str(url))
    return f"{parsed.host}:{parsed.port}" if parsed.port else parsed.host


@dataclass(frozen=True)
class Allowlist:
    origins: frozenset[Origin]

    @classmethod
    def from_base_urls(cls, urls: Iterable[str]) -> Allowlist:
        found = (origin_of(url) for url in urls)
        return cls(frozenset(origin for origin in found if origin is not None))

    @classmethod
    def from_profiles(cls, profiles: Mapping[str, Profile]) -> Allowlist:
        return cls.from_base_urls(p.api.base_url for p in profiles.values() if p.api is not None)

    def allows(self, url: str | httpx.URL) -> bool:
        origin = origin_of(url)
        return origin is not None and origin in self.origins

    def check(self, url: str | httpx.URL) -> None:
        if not self.allows(url):
            host = _describe(url)
            raise HostNotAllowed(
                f"outbound request to host {host} refused: it is not the base_url host of "
                "any loaded profile"
            )


def same_origin(url: str | httpx.URL, base_url: str) -> bool:
    """Whether `url` points at the profile's own host (where its API key may go)."""
    origin = origin_of(url)
    return origin is not None and origin == origin_of(base_url)
