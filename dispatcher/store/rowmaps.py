"""Rows of the several-hosts tables to records; shared by every backend."""

from __future__ import annotations

from dispatcher.store.hosts import Host, Lease
from dispatcher.store.rows import RowLike


def row_to_host(row: RowLike) -> Host:
    return Host(
        id=row["id"],
        url=row["url"],
        started_at=row["started_at"],
        heartbeat_at=row["heartbeat_at"],
        dead_at=row["dead_at"],
    )


def row_to_lease(row: RowLike) -> Lease:
    return Lease(
        account=row["account"], host=row["host"], token=row["token"], expires_at=row["expires_at"]
    )
