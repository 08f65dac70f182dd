"""Anchored transactions with psycopg_pool (``ConnectionPool``, ``AsyncConnectionPool``)
against a real PostgreSQL and txmq: the caller's connection taken from the pool for the
block and given back after, clean (no transaction left for the pool to roll back) even when
the block failed or the server ended its session; and the pool itself as the producer's
source (``Decisions(pool)``), each statement on a connection borrowed for it. Before, a
pool's ``getconn`` as the factory kept the connections it lent: after the producer closed
them the pool still counted them out, and the application's own requests ran out of
connections (PoolTimeout)."""

from __future__ import annotations

import asyncio
import logging

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool, ConnectionPool

import txmq
from tests.integration.test_anchored import (anchored_producer, checked, consume, dsn, orders,  # noqa: F401 - fixtures
                                             pg, rows)
from tests.integration.test_anchored_timeouts import wait_session_ended
from tests.integration.test_checks import COMMITTED, ROLLED_BACK, wait_state
from tests.support.waiting import wait_until
from txmq.aio import AsyncTransactionProducer
from txmq.anchored import Decisions

pytestmark = pytest.mark.timeout(120)

#: Connections the pools hold at most: the application's blocks and the producer's
#: statements share them.
POOL_SIZE = 2


def refused_commit_table(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as setup:
        setup.execute("CREATE TABLE once (id text, CONSTRAINT once_id UNIQUE (id) DEFERRABLE INITIALLY DEFERRED)")


def test_a_pool_lends_the_callers_connection_and_the_producers_statements_and_gets_them_all_back(
        checked, dsn, unique_name, caplog):
    """One pool for the application's blocks and the producer's own statements (checks,
    deletes, sweeps): a commit, a block that raises, a COMMIT the database refuses, a
    session the server ended for idling (the pool replaces that connection), and checks of
    an abandoned transaction answered from the pool. Every connection comes back clean
    (the pool never has to roll one back), and once the producer is closed the
    application gets every connection of the pool at once."""
    group, topic = unique_name("g"), unique_name("orders")
    checked.create_topic(topic, 1)
    refused_commit_table(dsn)
    caplog.set_level(logging.WARNING, logger="psycopg.pool")
    with ConnectionPool(dsn, min_size=1, max_size=POOL_SIZE, timeout=20, kwargs={"prepare_threshold": None}) as pool:
        with anchored_producer(checked, group, pool, answer_checks=False) as producer, \
                anchored_producer(checked, group, pool, answer_checks=False,
                                  idle_in_transaction_timeout_seconds=0.2) as idler:
            with pool.connection() as conn:
                with producer.transaction(conn) as tx:
                    tx.send(txmq.Message(topic, b"committed"))
                    conn.execute("INSERT INTO orders VALUES ('o1', 'x')")
            assert tx.result.wait_acknowledged(10), tx.result.end_error
            committed = tx.result.messages[0]

            with pytest.raises(LookupError), pool.connection() as conn:
                with producer.transaction(conn) as tx:
                    raised = tx.send(txmq.Message(topic, b"raised")).result(10)
                    conn.execute("INSERT INTO orders VALUES ('o2', 'x')")
                    raise LookupError("out of stock")

            with pytest.raises(psycopg.errors.UniqueViolation), pool.connection() as conn:
                with producer.transaction(conn) as tx:
                    refused = tx.send(txmq.Message(topic, b"refused")).result(10)
                    conn.execute("INSERT INTO once VALUES ('a'), ('a')")  # checked at COMMIT

            with pytest.raises(psycopg.errors.IdleInTransactionSessionTimeout), pool.connection() as conn:
                with idler.transaction(conn) as tx:
                    idled = tx.send(txmq.Message(topic, b"idled")).result(10)
                    wait_session_ended(dsn, conn.info.backend_pid)

            with pool.connection() as conn:
                tx = producer.transaction(conn)
                tx.__enter__()
                abandoned = tx.send(txmq.Message(topic, b"abandoned")).result(10)
                conn.rollback()  # nothing tells the broker: only a check can roll it back
            with anchored_producer(checked, group, pool, answer_checks=False) as instance:
                answers = [instance._decision_store.check(abandoned) for _ in range(2)]
            wait_until(lambda: rows(dsn) == [("rollback", None), ("rollback", None)], 15,
                       message=lambda: f"decision rows: {rows(dsn)}")  # the idled one's and the abandoned one's fences
        with pool.connection(timeout=10) as first, pool.connection(timeout=10) as second:
            assert first.execute("SELECT 1").fetchone() == second.execute("SELECT 1").fetchone() == (1,)
        returned_broken = pool.get_stats().get("returns_bad", 0)
    assert answers == [txmq.LocalTransactionState.ROLLBACK] * 2
    for half in (raised, refused, idled, abandoned):
        wait_state(checked, half.transaction_id, ROLLED_BACK)
    wait_state(checked, committed.transaction_id, COMMITTED)
    assert orders(dsn) == ["o1"]
    assert [m.body for m in consume(checked, topic, unique_name("c"), 1)] == [b"committed"]
    assert returned_broken == 1  # the session the server ended, replaced by the pool
    # Nothing came back inside a transaction for the pool to roll back (or still running).
    assert not [r for r in caplog.records if "returned connection" in r.getMessage()], caplog.text


def test_an_asyncio_pool_lends_the_callers_connection_and_the_producers_statements(checked, dsn, unique_name):
    group, topic = unique_name("g"), unique_name("orders")
    checked.create_topic(topic, 1)
    refused_commit_table(dsn)

    async def main() -> list[txmq.TransactionMessage]:
        async with AsyncConnectionPool(dsn, min_size=1, max_size=POOL_SIZE, timeout=20,
                                       kwargs={"prepare_threshold": None}) as pool:
            producer = AsyncTransactionProducer(checked.nameserver_address, producer_group=group,
                                                answer_checks=False, decisions=Decisions(pool))
            await producer.start()
            try:
                async with pool.connection() as conn:
                    async with producer.transaction(conn) as tx:
                        tx.send(txmq.Message(topic, b"committed"))
                        await conn.execute("INSERT INTO orders VALUES ('o1', 'x')")
                assert await tx.result.wait_acknowledged(10), tx.result.end_error
                with pytest.raises(psycopg.errors.UniqueViolation):
                    async with pool.connection() as conn:
                        async with producer.transaction(conn) as tx:
                            refused = await tx.send(txmq.Message(topic, b"refused"))
                            await conn.execute("INSERT INTO once VALUES ('a'), ('a')")
                async with pool.connection() as conn:
                    tx = producer.transaction(conn)
                    await tx.__aenter__()
                    abandoned = await tx.send(txmq.Message(topic, b"abandoned"))
                    await conn.rollback()
                other = AsyncTransactionProducer(checked.nameserver_address, producer_group=group,
                                                 answer_checks=False, decisions=Decisions(pool))
                await other.start()
                try:
                    assert await other._decision_store.check(abandoned) is txmq.LocalTransactionState.ROLLBACK
                finally:
                    await other.close()
            finally:
                await producer.close()
            async with pool.connection(timeout=10) as first, pool.connection(timeout=10) as second:
                assert await (await first.execute("SELECT 1")).fetchone() == (1,)
                assert await (await second.execute("SELECT 1")).fetchone() == (1,)
            return [refused, abandoned]

    refused, abandoned = asyncio.run(main())
    for half in (refused, abandoned):
        wait_state(checked, half.transaction_id, ROLLED_BACK)
    assert orders(dsn) == ["o1"]
    assert [m.body for m in consume(checked, topic, unique_name("c"), 1)] == [b"committed"]
    wait_until(lambda: rows(dsn) == [("rollback", None)], 15, message=lambda: f"decision rows: {rows(dsn)}")


def test_a_pools_getconn_as_the_factory_is_refused():
    """The SDK closes the connections a factory made; a pool's would never be given back."""
    pool = ConnectionPool("host=127.0.0.1 dbname=none", open=False)
    with pytest.raises(txmq.InvalidFieldError, match="the pool itself"):
        Decisions(pool.getconn)
    Decisions(pool)  # accepted
