"""A fresh PostgreSQL database per test, on the local server, dropped after.

The server runs on loopback (trust auth, user postgres); `.ci/run` starts it.
Unreachable, the test FAILS saying so: a skipped database test would hide
exactly the breakage it exists to catch.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import secrets
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest

from dispatcher.store import migrate_only

ADMIN_URL = os.environ.get(
    "DISPATCHER_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)


def _admin() -> psycopg.Connection[tuple[object, ...]]:
    try:
        return psycopg.connect(ADMIN_URL, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        pytest.fail(
            f"PostgreSQL is not reachable at {ADMIN_URL} ({exc}); start it "
            "(.ci/run does: pg_ctlcluster <version> main start). "
            "Database tests never skip.",
            pytrace=False,
        )


def _url(name: str) -> str:
    return ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"


@contextmanager
def _database(template: str | None) -> Iterator[str]:
    name = f"dispatcher_test_{secrets.token_hex(6)}"
    with _admin() as admin:
        admin.execute(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))
    try:
        yield _url(name)
    finally:
        with _admin() as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextmanager
def fresh_database() -> Iterator[str]:
    """The URL of a new empty database (no migration run), dropped (connections
    and all) after: for a test of the migrations themselves."""
    with _database(None) as url:
        yield url


# This process's migrated template: built once by the store's own migrations
# (this checkout's), then copied by the server for each test. A copy takes a
# fraction of the second or more that running every migration costs, paid by
# each of the few dozen PostgreSQL tests of a run.
_template: str | None = None
_template_lock = threading.Lock()


def _drop_template(name: str) -> None:
    try:
        with psycopg.connect(ADMIN_URL, autocommit=True, connect_timeout=5) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    except psycopg.Error:
        pass  # the server went first: nothing of ours is left to hold


def _migrated_template() -> str:
    global _template
    with _template_lock:
        if _template is None:
            name = f"dispatcher_test_template_{secrets.token_hex(6)}"
            with _admin() as admin:
                admin.execute(f'CREATE DATABASE "{name}"')
            atexit.register(_drop_template, name)
            # Its own thread and loop: the caller may be inside a running loop
            # (an async test), where asyncio.run is refused.
            done: list[BaseException] = []

            def migrate() -> None:
                try:
                    asyncio.run(migrate_only(_url(name)))
                except BaseException as exc:  # re-raised in the caller
                    done.append(exc)

            worker = threading.Thread(target=migrate)
            worker.start()
            worker.join()
            if done:
                raise done[0]
            _template = name
        return _template


@contextmanager
def migrated_database() -> Iterator[str]:
    """The URL of a new database already at the latest schema version (a copy
    of this process's template), dropped (connections and all) after. The
    store's own migrate on it finds nothing to do, as on any restart."""
    with _database(_migrated_template()) as url:
        yield url
