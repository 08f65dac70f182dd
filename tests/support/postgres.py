"""A private PostgreSQL for tests (Debian's ``postgresql``, ``make test`` installs it): one
cluster per test session (``initdb`` into a temporary folder, on a free loopback port,
stopped and removed at the end), started by ``bench.peers.PostgresInstance``. Each test
gets a database of its own (:func:`fresh_database`), so tests never see each other's rows.
"""

from __future__ import annotations

import itertools
import os

from bench.peers import PostgresInstance

__all__ = ["PostgresInstance", "dsn_for", "fresh_database"]

_names = itertools.count(1)


def dsn_for(instance: PostgresInstance, database: str) -> str:
    return f"host=127.0.0.1 port={instance.port} user=bench dbname={database}"


def fresh_database(instance: PostgresInstance, prefix: str = "t") -> str:
    """Creates an empty database and returns its connection string."""
    import psycopg

    name = f"{prefix}_{os.getpid()}_{next(_names)}"
    with psycopg.connect(instance.dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return dsn_for(instance, name)
