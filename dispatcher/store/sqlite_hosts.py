"""The several-hosts operations on SQLite: one host, same answers.

A SQLite file serves one machine, so these are the same statements as on
PostgreSQL (`store.sql`) without the locks: the service's lock on its state
dir already makes it the only writer.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from typing import Any

from dispatcher.store import sql
from dispatcher.store.hosts import Host, Lease, LeaseRefused
from dispatcher.store.rowmaps import row_to_host, row_to_lease


class SqliteHostOps:
    def _query(
        self, sql: str, args: Sequence[Any] = (), *, what: str = "read"
    ) -> list[sqlite3.Row]:
        raise NotImplementedError

    def _write1(self, sql: str, args: Sequence[Any] = ()) -> list[sqlite3.Row]:
        raise NotImplementedError

    # -- hosts ---------------------------------------------------------------
    async def register_host(self, host: str, now: float, url: str | None = None) -> None:
        self._write1(sql.HOST_REGISTER, (host, url, now, now))

    async def host_heartbeat(self, host: str, now: float) -> bool:
        return bool(self._write1(sql.HOST_BEAT, (now, host)))

    async def list_hosts(self) -> list[Host]:
        return [row_to_host(r) for r in self._query(sql.HOSTS)]

    async def stale_hosts(self, heartbeat_before: float) -> list[Host]:
        return [row_to_host(r) for r in self._query(sql.HOSTS_STALE, (heartbeat_before,))]

    async def publish_models(self, host: str, cards: Mapping[str, str]) -> None:
        """One host on SQLite: its own profiles are every model there is."""

    async def served_models(self) -> list[tuple[str, str, str]]:
        return []

    async def mark_host_dead(self, host: str, heartbeat_before: float, now: float) -> bool:
        return bool(self._write1(sql.HOST_DEAD, (now, host, heartbeat_before)))

    async def tell_job_finish(self, job_id: str, last_finished_at: float) -> bool:
        return bool(self._write1(sql.JOB_FINISH_TELL, (last_finished_at, job_id, last_finished_at)))

    async def tell_budget_reached(self, provider: str, until: float, now: float) -> bool:
        return bool(self._write1(sql.BUDGET_TELL, (provider, until, now)))

    # -- account leases --------------------------------------------------------
    async def acquire_lease(
        self, account: str, host: str, now: float, ttl_s: float
    ) -> Lease | LeaseRefused:
        rows = self._write1(sql.LEASE_ACQUIRE, (account, host, now + ttl_s, now))
        if rows:
            return row_to_lease(rows[0])
        (owner,) = self._query(sql.LEASE_OWNER, (account,))
        return LeaseRefused(account, owner["host"], owner["expires_at"])

    async def renew_lease(self, lease: Lease, now: float, ttl_s: float) -> Lease | None:
        rows = self._write1(sql.LEASE_RENEW, (now + ttl_s, lease.account, lease.host, lease.token))
        return row_to_lease(rows[0]) if rows else None

    async def release_lease(self, lease: Lease) -> bool:
        with_rows = self._write1(
            sql.LEASE_RELEASE + " RETURNING account", (lease.account, lease.host, lease.token)
        )
        return bool(with_rows)

    async def list_leases(self) -> list[Lease]:
        return [row_to_lease(r) for r in self._query(sql.LEASES)]

    # -- a provider's Retry-After gate ------------------------------------------------
    async def set_gate(self, provider: str, not_before: float) -> None:
        self._write1(sql.GATE_SET, (provider, not_before))

    async def get_gate(self, provider: str) -> float:
        rows = self._query(sql.GATE_GET, (provider,))
        return float(rows[0][0]) if rows else 0.0
