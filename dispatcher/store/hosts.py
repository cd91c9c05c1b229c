"""Records of several hosts sharing one database: hosts, account leases, guards.

On SQLite there is one host; the same operations answer as for one host.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Host:
    id: str
    url: str | None
    started_at: float
    heartbeat_at: float
    dead_at: float | None = None

    @property
    def alive(self) -> bool:
        return self.dead_at is None


@dataclass(frozen=True)
class Lease:
    """A web account bound to the host holding its browser profile.

    `token` grows with every grant of the account (to any host, the same one
    again included) and is never reused: it fences off the writes of an
    earlier holder (see `Fence`)."""

    account: str
    host: str
    token: int
    expires_at: float


@dataclass(frozen=True)
class LeaseRefused:
    """Another live host holds the account."""

    account: str
    holder: str  # the host holding it
    expires_at: float

    @property
    def message(self) -> str:
        return (
            f"web account {self.account!r} is served by host {self.holder!r}; "
            "stop it there (or let its lease lapse) before serving it here"
        )


@dataclass(frozen=True)
class Fence:
    """A task write's proof that its account's lease is still the one it ran under."""

    account: str
    token: int


@dataclass(frozen=True)
class Quota:
    """At most `limit` running tasks held by `owner` (an API provider), all hosts together."""

    owner: str
    limit: int
