"""Persistence behind one narrow interface (`Store`); SQLite by default.

Owns the `Store` protocol (`base`), its SQLite and PostgreSQL backends
(`sqlite*`, `postgres*`), the SQL both share (`sql`, `rows`, `rowmaps`,
`cachesql`), the cache index, the webhook outbox, host rows and leases, and
the migrations of each dialect.

May import: the shared top-level modules only; everything else imports it.
"""

from __future__ import annotations

from dispatcher.errors import ConfigError
from dispatcher.store.base import NextClaim, Store, TaskWrite

__all__ = ["NextClaim", "Store", "TaskWrite", "dialect_of", "open_store"]


def dialect_of(url: str) -> str:
    """`sqlite` or `postgresql`, from a database URL; ConfigError for anything else."""
    if url.startswith("sqlite:///"):
        return "sqlite"
    if url.startswith(("postgresql://", "postgres://")):
        return "postgresql"
    raise ConfigError(
        f"unsupported database URL {url.split(':', 1)[0]!r}: "
        "use sqlite:///<path> or postgresql://user@host:port/database"
    )


def _unopened(url: str, host: str) -> Store:
    if dialect_of(url) == "sqlite":
        from dispatcher.store.sqlite import SqliteStore

        return SqliteStore(url.removeprefix("sqlite:///"), host)
    from dispatcher.store.postgres import PostgresStore

    return PostgresStore(url, host)


async def open_store(url: str, host: str = "") -> Store:
    """A migrated store for a `sqlite:///path` or `postgresql://...` URL.

    `host` names this machine among those sharing the database (the cache
    index records it on every entry).
    """
    store = _unopened(url, host)
    try:
        await store.migrate()
    except BaseException:
        await store.close()
        raise
    return store


async def migrate_only(url: str) -> int:
    """Apply the migrations and nothing else; the schema version reached."""
    store = _unopened(url, "")
    try:
        await store.migrate()
        return await store.schema_version()
    finally:
        await store.close()
