"""Anchored transactions through a real PgBouncer (tests/support/pgbouncer.py: Debian's
1.18, older than PgBouncer's prepared-statement support) in transaction and session
pooling, in front of the test's PostgreSQL: the caller's connection, the producers' own
connections (from a connection string, sync and asyncio, and from a SQLAlchemy engine set
up as docs/anchored-transactions.md says) and the checks they answer.

In transaction pooling a server-side prepared statement stays on the server connection
that prepared it, where the next client's transaction runs: psycopg's automatic preparing
(``prepare_threshold``, 5 executions by default) then fails ("prepared statement ... already
exists") or runs another client's statement. One server connection
(``default_pool_size = 1``) makes every client share it, so the collision is certain rather
than likely. The invariant: a message is delivered iff its local transaction committed, and
no decision row but the checks' fences is left."""

from __future__ import annotations

import asyncio
from typing import Any, Iterator

import psycopg
import pytest
import sqlalchemy
from sqlalchemy.orm import Session

import txmq
from tests.integration.test_anchored import (anchored_producer, checked, consume, dsn, orders,  # noqa: F401 - fixtures
                                             pg, rows)
from tests.integration.test_checks import COMMITTED, ROLLED_BACK, wait_state
from tests.support.pgbouncer import PgBouncer, require_pgbouncer
from tests.support.postgres import PostgresInstance
from tests.support.waiting import wait_until
from txmq.aio import AsyncTransactionProducer
from txmq.anchored import Decisions

pytestmark = pytest.mark.timeout(180)

#: Checks each instance answers: more than psycopg's default prepare_threshold (5).
CHECKS = 7


@pytest.fixture(params=["transaction", "session"])
def bouncer(request: pytest.FixtureRequest, pg: PostgresInstance, tmp_path) -> Iterator[PgBouncer]:
    require_pgbouncer()
    # Transaction pooling: one server connection for every client. Session pooling holds
    # one per client, so it needs as many as the test has clients.
    size = 1 if request.param == "transaction" else 20
    b = PgBouncer(tmp_path / "pgbouncer", pg.port, request.param, default_pool_size=size)
    try:
        yield b
    finally:
        b.stop()


def abandon(producer: txmq.TransactionProducer, conn: Any, topic: str, body: bytes) -> txmq.TransactionMessage:
    """A half whose local transaction rolled back with nothing telling the broker: only a
    check can roll it back (it fences the key)."""
    tx = producer.transaction(conn)
    tx.__enter__()
    half = tx.send(txmq.Message(topic, body)).result(10)
    conn.rollback()
    return half


def engine_through(bouncer_dsn: str) -> sqlalchemy.Engine:
    """A SQLAlchemy engine set up for a transaction-pooling PgBouncer as the docs say:
    psycopg's automatic server-side preparing off."""
    parts = dict(p.split("=", 1) for p in bouncer_dsn.split())
    return sqlalchemy.create_engine(
        f"postgresql+psycopg://{parts['user']}@{parts['host']}:{parts['port']}/{parts['dbname']}",
        connect_args={"prepare_threshold": None})


@pytest.mark.parametrize("flavour", ["sync", "asyncio", "sqlalchemy"])
def test_checks_answered_by_several_instances_through_pgbouncer(checked, dsn, bouncer, unique_name, flavour):
    """Every instance of a group answers checks from the table: two of them, their own
    connections through PgBouncer, each answer the checks of transactions that rolled back
    (the first fences each key, the second finds the fence) — all ROLLBACK, never UNKNOWN
    from a statement PgBouncer's sharing broke. A committed transaction's message is
    delivered, the abandoned ones never are; the check's ``lock_timeout`` (set local to its
    statement's transaction) is not left on the shared server connection."""
    group, topic = unique_name("g"), unique_name("orders")
    checked.create_topic(topic, 1)
    through = bouncer.dsn(dsn)
    source: Any = engine_through(through) if flavour == "sqlalchemy" else through
    with anchored_producer(checked, group, source, answer_checks=False) as sender, \
            psycopg.connect(through, prepare_threshold=None) as conn:  # the docs' setting for the caller's own
        if flavour == "sqlalchemy":  # the caller's Session on the same engine
            with Session(source) as session, sender.transaction(session) as tx:
                tx.send(txmq.Message(topic, b"committed"))
                session.execute(sqlalchemy.text("INSERT INTO orders VALUES ('o1', 'x')"))
        else:
            with sender.transaction(conn) as tx:
                tx.send(txmq.Message(topic, b"committed"))
                conn.execute("INSERT INTO orders VALUES ('o1', 'x')")
        assert tx.result.wait_acknowledged(10), tx.result.end_error
        halves = [abandon(sender, conn, topic, f"abandoned-{i}".encode()) for i in range(CHECKS)]

        if flavour == "asyncio":
            async def answers() -> list[Any]:
                got = []
                for _instance in range(2):
                    p = AsyncTransactionProducer(checked.nameserver_address, producer_group=group,
                                                 answer_checks=False, decisions=Decisions(through))
                    await p.start()
                    try:
                        got += [await p._decision_store.check(h) for h in halves]
                    finally:
                        await p.close()
                return got
            answered = asyncio.run(answers())
        else:
            answered = []
            for _instance in range(2):
                with anchored_producer(checked, group, source, answer_checks=False) as instance:
                    answered += [instance._decision_store.check(h) for h in halves]
        if flavour == "sqlalchemy":
            source.dispose()

    assert answered == [txmq.LocalTransactionState.ROLLBACK] * (2 * CHECKS)
    for half in halves:
        wait_state(checked, half.transaction_id, ROLLED_BACK)
    wait_state(checked, tx.result.messages[0].transaction_id, COMMITTED)
    assert [m.body for m in consume(checked, topic, unique_name("c"), 1)] == [b"committed"]
    assert orders(dsn) == ["o1"]
    wait_until(lambda: rows(dsn) == [("rollback", None)] * CHECKS, 15,
               message=lambda: f"decision rows: {rows(dsn)}")
    with psycopg.connect(through, prepare_threshold=None, autocommit=True) as probe:
        assert probe.execute("SHOW lock_timeout").fetchone() == ("0",)
