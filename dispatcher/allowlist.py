"""The outbound allowlist: requests go only to hosts named in the profiles.

Built once from the `base_url` of every loaded API profile and the `url` of
every web profile; both runners share it. URLs a provider or a page
hands back (fal's status and result URLs, CDN links, media on a page) are checked the same
way, so a compromised or confused provider cannot steer the runner, and the
API key it carries, anywhere else. The check runs before the connection is
opened, so a refused host receives not a single byte.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import httpx

from dispatcher.errors import HostNotAllowed
from dispatcher.fetch import Origin, origin_of
from dispatcher.profiles import Profile

__all__ = ["Allowlist", "Origin", "origin_of", "same_origin"]


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
        """Every provider's API `base_url` and every web page's `url`: the hosts profiles name."""
        urls = [p.api_for(name).base_url for p in profiles.values() for name in p.provider_names]
        urls += [p.web.url for p in profiles.values() if p.web is not None]
        return cls.from_base_urls(urls)

    def allows(self, url: str | httpx.URL) -> bool:
        origin = origin_of(url)
        return origin is not None and origin in self.origins

    def check(self, url: str | httpx.URL) -> None:
        if not self.allows(url):
            host = _describe(url)
            raise HostNotAllowed(
                f"outbound request to host {host} refused: it is not the host of any loaded "
                "profile (an API base_url or a web page url)"
            )


def same_origin(url: str | httpx.URL, base_url: str) -> bool:
    """Whether `url` points at the profile's own host (where its API key may go)."""
    origin = origin_of(url)
    return origin is not None and origin == origin_of(base_url)
