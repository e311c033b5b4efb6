"""A PostgreSQL server for tests: a fresh database per test, dropped afterwards.

The server is ``FIELD_TEST_POSTGRES`` (a URL of a database to connect to while creating
and dropping test databases), by default the local one at 127.0.0.1:5432 as user
``postgres`` or ``root``. When none answers, or psycopg is not installed, the tests that
need it are skipped with a reason naming the URL tried.
"""

from __future__ import annotations

import functools
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

#: Admin URLs tried in turn (trust authentication on the local server).
CANDIDATES = (
    (os.environ["FIELD_TEST_POSTGRES"],)
    if os.environ.get("FIELD_TEST_POSTGRES")
    else (
        "postgresql://postgres@127.0.0.1:5432/test",
        "postgresql://root@127.0.0.1:5432/test",
    )
)


@functools.cache
def admin_url() -> str | None:
    """The first candidate URL that connects, or None."""
    try:
        import psycopg
    except ImportError:
        return None
    for url in CANDIDATES:
        try:
            with psycopg.connect(url, connect_timeout=2):
                return url
        except psycopg.Error:
            continue
    return None


def require_postgres() -> str:
    """The admin URL, or skip the test loudly naming what was tried."""
    url = admin_url()
    if url is None:
        try:
            import psycopg  # noqa: F401
        except ImportError:
            pytest.skip("SKIPPED PostgreSQL tests: psycopg is not installed (postgres extra)")
        pytest.skip(f"SKIPPED PostgreSQL tests: no PostgreSQL server at {' or '.join(CANDIDATES)}")
    return url


def with_database(url: str, name: str) -> str:
    """``url`` with its database replaced by ``name``."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    params = conninfo_to_dict(url)
    params["dbname"] = name
    user = params.get("user", "")
    host = params.get("host", "127.0.0.1")
    port = params.get("port", "5432")
    password = params.get("password")
    auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    assert make_conninfo(**params)  # the parameters are valid
    return f"postgresql://{auth}{host}:{port}/{name}"


@contextmanager
def fresh_database() -> Iterator[str]:
    """A new, empty database (its URL), dropped when the block ends."""
    import psycopg

    admin = require_postgres()
    name = f"field_test_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield with_database(admin, name)
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
