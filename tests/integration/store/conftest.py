from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from dispatcher.store import Store, open_store
from dispatcher.store.postgres import PostgresStore
from tests.support.pgdb import fresh_database, migrated_database

OpenStore = Callable[..., Awaitable[Store]]


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A new database of the param's kind: on PostgreSQL already migrated (a
    copy of a template), unless the test is marked `empty_database` (one that
    checks the migrations themselves)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'contract.db'}"
    else:
        empty = request.node.get_closest_marker("empty_database") is not None
        with fresh_database() if empty else migrated_database() as url:
            yield url


@pytest.fixture
async def open_stores(database_url: str) -> AsyncIterator[OpenStore]:
    """Opens stores on the test's database, each its own connection(s); all
    closed after the test."""
    opened: list[Store] = []

    async def opener(host: str = "h1") -> Store:
        store = await open_store(database_url, host)
        opened.append(store)
        return store

    yield opener
    for store in opened:
        await store.close()


@pytest.fixture
async def store(open_stores: OpenStore) -> Store:
    return await open_stores()


@pytest.fixture
async def pg_store_at() -> AsyncIterator[tuple[PostgresStore, str]]:
    """A PostgreSQL store (host `h1`) on a new migrated database, and the
    database's URL (for a connection of the test's own)."""
    with migrated_database() as url:
        opened = await open_store(url, "h1")
        assert isinstance(opened, PostgresStore)
        try:
            yield opened, url
        finally:
            await opened.close()
