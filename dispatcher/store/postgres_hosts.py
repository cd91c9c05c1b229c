"""The several-hosts operations on PostgreSQL (statements in `store.sql`).

Each is one statement: a lease is granted by one upsert guarded on its
holder, a host declared dead by one compare-and-set, so two hosts racing
for the same account or declaring the same host dead see one winner.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from dispatcher.store import sql
from dispatcher.store.hosts import Host, Lease, LeaseRefused
from dispatcher.store.pggates import GATE_SET, GateMirror
from dispatcher.store.rowmaps import row_to_host, row_to_lease

# What each host runs (PostgreSQL only: on SQLite one host runs everything it knows).
_MODELS_DROP = "DELETE FROM host_models WHERE host = %s AND NOT (model = ANY(%s))"
_MODELS_PUT = """INSERT INTO host_models (host, model, card)
    SELECT %s, m, c FROM unnest(%s::text[], %s::text[]) AS u(m, c)
    ON CONFLICT (host, model) DO UPDATE SET card = excluded.card"""
_MODELS_SERVED = """SELECT m.host, m.model, m.card FROM host_models AS m
    JOIN hosts AS h ON h.id = m.host WHERE h.dead_at IS NULL ORDER BY m.model, m.host"""


def display_url(url: str) -> str:
    """The database URL without its password, for messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))


class PostgresHostOps:
    # The providers' gates as this host's listener hears them (live once it listens).
    gates: GateMirror

    async def _query(
        self, sql: str, args: Sequence[Any] = (), *, what: str = "read"
    ) -> list[dict[str, Any]]:
        raise NotImplementedError

    async def _write1(
        self, sql: str, args: Sequence[Any] = (), *, marked: bool = False
    ) -> list[dict[str, Any]]:
        raise NotImplementedError

    # -- hosts ---------------------------------------------------------------
    async def register_host(self, host: str, now: float, url: str | None = None) -> None:
        await self._write1(sql.HOST_REGISTER, (host, url, now, now))

    async def host_heartbeat(self, host: str, now: float) -> bool:
        return bool(await self._write1(sql.HOST_BEAT, (now, host)))

    async def list_hosts(self) -> list[Host]:
        return [row_to_host(r) for r in await self._query(sql.HOSTS)]

    async def stale_hosts(self, heartbeat_before: float) -> list[Host]:
        return [row_to_host(r) for r in await self._query(sql.HOSTS_STALE, (heartbeat_before,))]

    async def mark_host_dead(self, host: str, heartbeat_before: float, now: float) -> bool:
        return bool(await self._write1(sql.HOST_DEAD, (now, host, heartbeat_before)))

    async def publish_models(self, host: str, cards: Mapping[str, str]) -> None:
        models = sorted(cards)
        await self._write1(_MODELS_DROP, (host, models), marked=True)
        await self._write1(_MODELS_PUT, (host, models, [cards[m] for m in models]), marked=True)

    async def served_models(self) -> list[tuple[str, str, str]]:
        rows = await self._query(_MODELS_SERVED)
        return [(r["host"], r["model"], r["card"]) for r in rows]

    async def tell_job_finish(self, job_id: str, last_finished_at: float) -> bool:
        rows = await self._write1(sql.JOB_FINISH_TELL, (last_finished_at, job_id, last_finished_at))
        return bool(rows)

    async def tell_budget_reached(self, provider: str, until: float, now: float) -> bool:
        return bool(await self._write1(sql.BUDGET_TELL, (provider, until, now)))

    # -- account leases --------------------------------------------------------
    async def acquire_lease(
        self, account: str, host: str, now: float, ttl_s: float
    ) -> Lease | LeaseRefused:
        rows = await self._write1(sql.LEASE_ACQUIRE, (account, host, now + ttl_s, now))
        if rows:
            return row_to_lease(rows[0])
        (owner,) = await self._query(sql.LEASE_OWNER, (account,))
        return LeaseRefused(account, owner["host"], owner["expires_at"])

    async def renew_lease(self, lease: Lease, now: float, ttl_s: float) -> Lease | None:
        rows = await self._write1(
            sql.LEASE_RENEW, (now + ttl_s, lease.account, lease.host, lease.token)
        )
        return row_to_lease(rows[0]) if rows else None

    async def release_lease(self, lease: Lease) -> bool:
        rows = await self._write1(
            sql.LEASE_RELEASE + " RETURNING account", (lease.account, lease.host, lease.token)
        )
        return bool(rows)

    async def list_leases(self) -> list[Lease]:
        return [row_to_lease(r) for r in await self._query(sql.LEASES)]

    # -- a provider's Retry-After gate ------------------------------------------------
    async def set_gate(self, provider: str, not_before: float) -> None:
        # Its notice tells the other hosts' listeners (`store.pggates`).
        await self._write1(GATE_SET, (provider, not_before), marked=True)
        self.gates.heard(provider, not_before)

    async def get_gate(self, provider: str) -> float:
        heard = self.gates.get(provider)
        if heard is not None:
            return heard  # the listener is connected: every gate set is heard
        rows = await self._query(sql.GATE_GET, (provider,))
        return float(rows[0]["not_before"]) if rows else 0.0
