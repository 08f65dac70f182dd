"""Anchored transactions against what applications do to their own transaction inside the
block, with a real PostgreSQL and txmq: a rollback followed by more statements, a commit
with several messages (or none), a task cancelled at the block's end. The invariant each
test holds the SDK to: a message is delivered iff the decision row committed, whatever
answers first (the end the SDK sends or a check), the caller is never told COMMITTED for
a transaction whose decision row is gone, and the decisions table drains."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

import txmq
from tests.integration.test_anchored import (anchored_producer, checked, dsn, orders, pg,  # noqa: F401 - fixtures
                                             rows)
from tests.integration.test_anchored_integrations import async_producing
from tests.integration.test_checks import BROKER_ENV, CHECKER_ENV, COMMITTED, ROLLED_BACK, describe, wait_state
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(120)


def test_a_rollback_inside_the_block_then_more_statements_is_not_committed(checked, dsn, unique_name):
    """The caller rolls back inside the block (the decision row goes with it) and runs more
    statements: psycopg begins a new transaction, so the block's end finds one open. Its
    COMMIT must not be reported as the decision: the row it would record is gone, and a
    check fences the key (ROLLBACK) while the end, had it been sent, would commit."""
    group, topic = unique_name("g"), unique_name("orders")
    checked.create_topic(topic, 1)
    with anchored_producer(checked, group, dsn, answer_checks=False) as producer, psycopg.connect(dsn) as conn:
        with pytest.raises(txmq.InvalidFieldError, match="ended inside the anchored block"):
            with producer.transaction(conn) as tx:
                half = tx.send(txmq.Message(topic, b"never")).result(10)
                conn.execute("INSERT INTO orders VALUES ('before', 'x')")
                conn.rollback()
                conn.execute("INSERT INTO orders VALUES ('after', 'x')")
        assert tx.result is None
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        wait_state(checked, half.transaction_id, ROLLED_BACK, timeout=20)
    assert orders(dsn) == []
    assert rows(dsn) == [("rollback", None)]  # the key fenced, as a check would have


def test_a_commit_inside_the_block_delivers_every_message_and_drains(checked, dsn, unique_name):
    """The caller commits inside the block: the decision row committed (with the caller's
    work) before the SDK recorded the halves. Every half must then commit, whatever order
    the checks come in (a check of one that finds the row deleted after committing another
    would fence the key), and the row must go."""
    group, topic = unique_name("g"), unique_name("orders")
    checked.create_topic(topic, 2)
    with anchored_producer(checked, group, dsn, answer_checks=False) as producer, psycopg.connect(dsn) as conn:
        with pytest.raises(txmq.InvalidFieldError, match="ended inside the anchored block"):
            with producer.transaction(conn) as tx:
                first = tx.send(txmq.Message(topic, b"first"))
                second = tx.send(txmq.Message(topic, b"second"))
                conn.execute("INSERT INTO orders VALUES ('o1', 'x')")
                first, second = first.result(10), second.result(10)
                conn.commit()
        store = producer._decision_store
        # The checks, one after the other, as the checker would send them with no producer
        # holding the key (the sender answers none here: the checks come only from this test).
        assert store.check(first) is txmq.LocalTransactionState.COMMIT
        wait_until(lambda: describe(checked, first.transaction_id).state == COMMITTED, 10)
        wait_until(lambda: rows(dsn) == [], 10, message=lambda: f"decision rows left: {rows(dsn)}")
        assert store.check(second) is txmq.LocalTransactionState.COMMIT
        wait_state(checked, second.transaction_id, COMMITTED)
    assert orders(dsn) == ["o1"]
    wait_until(lambda: rows(dsn) == [], 10, message=lambda: f"decision rows left: {rows(dsn)}")


def test_a_commit_inside_a_block_that_sent_nothing_leaves_no_row(checked, dsn, unique_name):
    """No message, and the caller commits inside the block: no check will ever come for
    the key, so nothing but the SDK can delete its committed decision row."""
    group = unique_name("g")
    with anchored_producer(checked, group, dsn, answer_checks=False, repair_after_seconds=0.5,
                           sweep_interval_seconds=0.2) as producer, psycopg.connect(dsn) as conn:
        with pytest.raises(txmq.InvalidFieldError, match="ended inside the anchored block"):
            with producer.transaction(conn):
                conn.execute("INSERT INTO orders VALUES ('o1', 'x')")
                conn.commit()
        wait_until(lambda: rows(dsn) == [], 10, message=lambda: f"decision rows left: {rows(dsn)}")
    assert orders(dsn) == ["o1"]


def test_a_task_cancelled_at_the_blocks_end_rolls_its_transaction_back(fresh_cluster_factory, dsn, unique_name):
    """asyncio.timeout / wait_for cancels the task while the block's end waits for a half
    (the broker is stalled). The block must not leave its transaction open on the caller's
    connection: the caller who catches the timeout and goes on would otherwise commit the
    decision row (and its half) with whatever it does next, or find the connection refused
    for its next transaction. The half is rolled back by the check."""
    cluster = fresh_cluster_factory(broker_env=BROKER_ENV, checker=True, checker_env=CHECKER_ENV)
    group, topic = unique_name("g"), unique_name("orders")
    cluster.create_topic(topic, 1)

    async def main() -> None:
        async with async_producing(cluster, group, dsn) as producer:
            conn = await psycopg.AsyncConnection.connect(dsn)
            try:
                tx = producer.transaction(conn)
                await tx.__aenter__()
                await conn.execute("INSERT INTO orders VALUES ('o1', 'x')")
                cluster.brokers[0].pause()
                try:
                    tx.send(txmq.Message(topic, b"stalled"))
                    with pytest.raises(TimeoutError):
                        await asyncio.wait_for(tx.__aexit__(None, None, None), 1.0)
                finally:
                    cluster.brokers[0].resume()
                assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
                await conn.execute("INSERT INTO orders VALUES ('o2', 'x')")  # the caller goes on
                await conn.commit()
                # The connection serves the next anchored transaction.
                async with producer.transaction(conn) as again:
                    again.send(txmq.Message(topic, b"next"))
                assert await again.result.wait_acknowledged(10)
            finally:
                await conn.close()

    asyncio.run(main())
    assert orders(dsn) == ["o2"]


def test_a_block_that_sends_nothing_commits_and_leaves_no_row(checked, dsn, unique_name):
    group = unique_name("g")
    with anchored_producer(checked, group, dsn, answer_checks=False) as producer, psycopg.connect(dsn) as conn:
        with producer.transaction(conn) as tx:
            conn.execute("INSERT INTO orders VALUES ('o1', 'x')")
        assert tx.result.state is txmq.TransactionState.COMMITTED and tx.result.messages == ()
        assert tx.result.acknowledged
        assert rows(dsn) == []  # deleted by the transaction's own commit
    assert orders(dsn) == ["o1"]


@pytest.mark.parametrize("connection", ["asyncio-psycopg", "sqlalchemy"])
@pytest.mark.parametrize("ending", ["commit", "rollback"])
def test_a_transaction_ended_inside_the_block_then_continued_follows_its_decision_row(checked, dsn, unique_name,
                                                                                      connection, ending):
    """The caller commits (or rolls back) inside the block and goes on in a new transaction:
    that one is rolled back, and both halves follow the decision row, committed with the
    caller's commit or rolled back with its rollback (answered by the SDK, no check here)."""
    import sqlalchemy
    from sqlalchemy.orm import Session

    from tests.integration.test_anchored_integrations import url

    group, topic = unique_name("g"), unique_name("orders")
    checked.create_topic(topic, 2)
    bodies = [b"first", b"second"]

    def sync() -> list:
        engine = sqlalchemy.create_engine(url(dsn))
        try:
            with anchored_producer(checked, group, dsn, answer_checks=False) as producer, Session(engine) as session:
                with pytest.raises(txmq.InvalidFieldError, match="ended inside the anchored block"):
                    with producer.transaction(session) as tx:
                        halves = [tx.send(txmq.Message(topic, b)) for b in bodies]
                        session.execute(sqlalchemy.text("INSERT INTO orders VALUES ('before', 'x')"))
                        session.commit() if ending == "commit" else session.rollback()
                        session.execute(sqlalchemy.text("INSERT INTO orders VALUES ('after', 'x')"))
                assert not session.in_transaction()
                return [h.result(10) for h in halves]
        finally:
            engine.dispose()

    async def asyncio_() -> list:
        async with async_producing(checked, group, dsn, answer_checks=False) as producer:
            async with await psycopg.AsyncConnection.connect(dsn) as conn:
                with pytest.raises(txmq.InvalidFieldError, match="ended inside the anchored block"):
                    async with producer.transaction(conn) as tx:
                        halves = [tx.send(txmq.Message(topic, b)) for b in bodies]
                        await conn.execute("INSERT INTO orders VALUES ('before', 'x')")
                        await (conn.commit() if ending == "commit" else conn.rollback())
                        await conn.execute("INSERT INTO orders VALUES ('after', 'x')")
                assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
                stored = [await h for h in halves]
                # The settling runs in the background: kept alive until it is done.
                await asyncio.to_thread(wait_until, lambda: all(
                    describe(checked, h.transaction_id).state in (COMMITTED, ROLLED_BACK) for h in stored), 20)
                return stored

    stored = sync() if connection == "sqlalchemy" else asyncio.run(asyncio_())
    committed = ending == "commit"
    for half in stored:
        wait_state(checked, half.transaction_id, COMMITTED if committed else ROLLED_BACK, timeout=20)
    assert orders(dsn) == (["before"] if committed else [])
    want = [] if committed else [("rollback", None)]
    wait_until(lambda: rows(dsn) == want, 10, message=lambda: f"decision rows: {rows(dsn)}")


def test_an_error_the_caller_caught_inside_the_block_rolls_back_at_its_end(checked, dsn, unique_name):
    """A unique violation on the caller's own row, caught inside the block: the transaction
    is aborted, so the block's COMMIT is refused (the driver's error), the half is rolled
    back and the connection is usable. A connection already aborted before the block is
    refused without a statement."""
    group, topic = unique_name("g"), unique_name("orders")
    checked.create_topic(topic, 1)
    with anchored_producer(checked, group, dsn, answer_checks=False) as producer, psycopg.connect(dsn) as conn:
        with pytest.raises(psycopg.errors.InFailedSqlTransaction):
            with producer.transaction(conn) as tx:
                half = tx.send(txmq.Message(topic, b"never"))
                conn.execute("INSERT INTO orders VALUES ('o1', 'x')")
                with pytest.raises(psycopg.errors.UniqueViolation):
                    conn.execute("INSERT INTO orders VALUES ('o1', 'x')")
        assert tx.result is None
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        wait_state(checked, half.result().transaction_id, ROLLED_BACK)
        with pytest.raises(psycopg.errors.DivisionByZero):
            conn.execute("SELECT 1 / 0")
        with pytest.raises(txmq.InvalidFieldError, match="outermost"):
            with producer.transaction(conn):
                pytest.fail("entered")
        conn.rollback()
    assert orders(dsn) == [] and rows(dsn) == []


def test_a_task_cancelled_inside_the_block_rolls_back_and_its_half_with_it(checked, dsn, unique_name):
    """Cancelled at an await inside the block (a statement running): the block's end sees
    CancelledError, rolls back and hints ROLLBACK for the half."""
    group, topic = unique_name("g"), unique_name("orders")
    checked.create_topic(topic, 1)

    async def main() -> str:
        async with async_producing(checked, group, dsn, answer_checks=False) as producer:
            async with await psycopg.AsyncConnection.connect(dsn) as conn:
                halves = []

                async def block() -> None:
                    async with producer.transaction(conn) as tx:
                        halves.append(tx.send(txmq.Message(topic, b"never")))
                        await conn.execute("INSERT INTO orders VALUES ('o1', 'x')")
                        await asyncio.shield(halves[0])  # stored before the cancel
                        await conn.execute("SELECT pg_sleep(60)")

                with pytest.raises(TimeoutError):
                    await asyncio.wait_for(block(), 10.0)  # pg_sleep(60) outlasts it
                assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
                transaction_id = (await halves[0]).transaction_id
                await asyncio.to_thread(wait_state, checked, transaction_id, ROLLED_BACK, 20)
                return transaction_id

    asyncio.run(main())
    assert orders(dsn) == [] and rows(dsn) == []


@pytest.mark.parametrize("then", ["raise", "more-then-raise"])
def test_a_commit_inside_a_block_that_then_raises_delivers_its_message(checked, dsn, unique_name, then):
    """The caller commits inside the block (its work and the decision row committed), then
    the block raises, with or without a new transaction begun after the commit. The rollback
    at the block's end rolls back only what came after the commit: the row says COMMIT, so
    the message must be delivered — a ROLLBACK hint for its half would lose the message of
    a committed transaction."""
    group, topic = unique_name("g"), unique_name("orders")
    checked.create_topic(topic, 1)
    with anchored_producer(checked, group, dsn, answer_checks=False) as producer, psycopg.connect(dsn) as conn:
        with pytest.raises(LookupError):
            with producer.transaction(conn) as tx:
                half = tx.send(txmq.Message(topic, b"committed inside")).result(10)
                conn.execute("INSERT INTO orders VALUES ('o1', 'x')")
                conn.commit()
                if then == "more-then-raise":
                    conn.execute("INSERT INTO orders VALUES ('o2', 'x')")  # a new transaction, rolled back
                raise LookupError("after the commit")
        wait_state(checked, half.transaction_id, COMMITTED, timeout=20)
    assert orders(dsn) == ["o1"]
    wait_until(lambda: rows(dsn) == [], 15, message=lambda: f"decision rows left: {rows(dsn)}")
