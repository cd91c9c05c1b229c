"""A fresh PostgreSQL database per test, on the local server, dropped after.

The server runs on loopback (trust auth, user postgres); `.ci/run` starts it.
Unreachable, the test FAILS saying so: a skipped database test would hide
exactly the breakage it exists to catch.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest

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


@contextmanager
def fresh_database() -> Iterator[str]:
    """The URL of a new empty database, dropped (connections and all) after."""
    name = f"dispatcher_test_{secrets.token_hex(6)}"
    with _admin() as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with _admin() as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
