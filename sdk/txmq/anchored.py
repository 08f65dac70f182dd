"""Transactions anchored in the application's PostgreSQL database: the decision is the
database commit, checks answer themselves from a decisions table, and EndTransaction is a
hint off the caller's path (docs/anchored-transactions.md; the protocol for any language:
protos/txmq/v1/DECISIONS.md)::

    import txmq
    from txmq.anchored import Decisions

    producer = txmq.TransactionProducer("127.0.0.1:9876", producer_group="orders",
                                        decisions=Decisions("dbname=shop"))
    with producer.transaction(conn) as tx:              # conn: psycopg.Connection / SQLAlchemy Session
        tx.send(txmq.Message("orders", b"..."))
        conn.execute("INSERT INTO orders ...")
    assert tx.result.state is txmq.TransactionState.COMMITTED

The table is created by ``txmq db init --dsn ...`` (or the SQL of :func:`schema_sql`).
psycopg 3 and SQLAlchemy 2 are optional: ``pip install 'txmq[psycopg]'`` / ``'txmq[sqlalchemy]'``.
"""

from ._anchored import (AnchoredResult, AnchoredTransaction, DBAPIConnection, LocalConnection, PsycopgConnection,
                        SQLAlchemySession)
from .aio._anchored import AsyncAnchoredResult, AsyncPsycopgConnection, AsyncSQLAlchemySession
from ._decisions import (ANCHOR_PROPERTY, DEFAULT_TABLE, DecisionSettings, Decisions, resolver_grants_sql,
                         schema_sql)

__all__ = ["ANCHOR_PROPERTY", "DEFAULT_TABLE", "AnchoredResult", "AnchoredTransaction", "AsyncAnchoredResult",
           "AsyncPsycopgConnection", "AsyncSQLAlchemySession", "DBAPIConnection",
           "DecisionSettings", "Decisions", "LocalConnection", "PsycopgConnection", "SQLAlchemySession",
           "resolver_grants_sql", "schema_sql"]
