"""Persistence behind one narrow interface (`Store`); SQLite by default."""

from __future__ import annotations

from dispatcher.errors import ConfigError
from dispatcher.store.base import Store

__all__ = ["Store", "open_store"]


async def open_store(url: str) -> Store:
    """A migrated store for a `sqlite:///path` or `postgresql://...` URL."""
    if url.startswith("sqlite:///"):
        from dispatcher.store.sqlite import SqliteStore

        store: Store = SqliteStore(url.removeprefix("sqlite:///"))
    else:
        raise ConfigError(
            f"unsupported database URL {url.split(':', 1)[0]!r}: use sqlite:///<path>"
        )
    await store.migrate()
    return store
