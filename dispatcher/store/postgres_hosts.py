"""The several-hosts operations on PostgreSQL (statements in `store.sql`).

Each is one statement: a lease is granted by one upsert guarded on its
holder, a host declared dead by one compare-and-set, so two hosts racing
for the same account or declaring the same host dead see one winner.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from dispatcher.store import sql
from dispatcher.store.hosts import Host, Lease, LeaseRefused
from dispatcher.store.rowmaps import row_to_host, row_to_lease


def display_url(url: str) -> str:
    """The database URL without its password, for messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))


class PostgresHostOps:
    async def _query(
        self, sql: str, args: Sequence[Any] = (), *, what: str = "read"
    ) -> list[dict[str, Any]]:
        raise NotImplementedError

    async def _write1(self, sql: str, args: Sequence[Any] = ()) -> list[dict[str, Any]]:
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

    async def tell_job_finish(self, job_id: str, last_finished_at: float) -> bool:
        rows = await self._write1(sql.JOB_FINISH_TELL, (last_finished_at, job_id, last_finished_at))
        return bool(rows)

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
        await self._write1(sql.GATE_SET, (provider, not_before))

    async def get_gate(self, provider: str) -> float:
        rows = await self._query(sql.GATE_GET, (provider,))
        return float(rows[0]["not_before"]) if rows else 0.0
