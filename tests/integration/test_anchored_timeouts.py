"""The server ends an anchored transaction's session for its idle-in-transaction timeout
(SQLSTATE 25P03) before the block's end, sync and asyncio, against a real PostgreSQL and
txmq. PostgreSQL raises that FATAL only while it waits for the next command, or for a
command it has read but not begun (postgres.c: the timeout is disabled once a command is
read, and a last-moment expiry is caught before it runs): the COMMIT never ran. The
transaction that ended is the one open on the connection, though, which is not the
decision's when the caller committed inside the block: the SDK then settles the halves
from the decision row (as for a transaction ended inside the block), from its own
connection. Nobody answers checks here, so only the SDK can tell the broker.

PostgreSQL 17's ``transaction_timeout`` (25P04) can fire after a durable commit (its
interrupt may be pending when CommitTransaction holds interrupts, and is raised once they
are resumed): its outcome stays unknown, left to the checks."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

import txmq
from tests.integration.test_anchored import (anchored_producer, checked, consume, dsn, orders,  # noqa: F401 - fixtures
                                             pg, rows)
from tests.integration.test_checks import COMMITTED, ROLLED_BACK, wait_state
from tests.support.waiting import wait_until
from txmq.aio import AsyncTransactionProducer
from txmq.anchored import Decisions

pytestmark = pytest.mark.timeout(120)

#: The idle bound the SDK sets on the caller's transaction (SET LOCAL in its first statement).
IDLE_SECONDS = 0.2


def wait_session_ended(dsn: str, backend_pid: int) -> None:
    """Until the server has ended the backend (its idle-in-transaction timeout)."""
    with psycopg.connect(dsn, autocommit=True) as probe:
        wait_until(lambda: probe.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s",
                                         (backend_pid,)).fetchone() == (0,), 30,
                   message=f"backend {backend_pid} still alive")


@pytest.mark.parametrize("flavour", ["sync", "asyncio"])
def test_a_transaction_the_server_ended_for_idling_is_rolled_back_and_its_halves_with_it(
        checked, dsn, unique_name, flavour):
    group, topic = unique_name("g"), unique_name("orders")
    checked.create_topic(topic, 1)

    if flavour == "sync":
        with anchored_producer(checked, group, dsn, answer_checks=False,
                               idle_in_transaction_timeout_seconds=IDLE_SECONDS) as producer, \
                psycopg.connect(dsn) as conn:
            with pytest.raises(psycopg.errors.IdleInTransactionSessionTimeout):
                with producer.transaction(conn) as tx:
                    half = tx.send(txmq.Message(topic, b"never")).result(10)
                    conn.execute("INSERT INTO orders VALUES ('o1', 'x')")
                    wait_session_ended(dsn, conn.info.backend_pid)
            assert tx.result is None
            wait_state(checked, half.transaction_id, ROLLED_BACK, timeout=20)
    else:
        async def main() -> txmq.TransactionMessage:
            producer = AsyncTransactionProducer(checked.nameserver_address, producer_group=group, answer_checks=False,
                                                decisions=Decisions(dsn, idle_in_transaction_timeout_seconds=
                                                                    IDLE_SECONDS))
            await producer.start()
            try:
                async with await psycopg.AsyncConnection.connect(dsn) as conn:
                    with pytest.raises(psycopg.errors.IdleInTransactionSessionTimeout):
                        async with producer.transaction(conn) as tx:
                            half = await tx.send(txmq.Message(topic, b"never"))
                            await conn.execute("INSERT INTO orders VALUES ('o1', 'x')")
                            await asyncio.to_thread(wait_session_ended, dsn, conn.info.backend_pid)
                    assert tx.result is None
                    await asyncio.to_thread(wait_state, checked, half.transaction_id, ROLLED_BACK, 20)
                return half
            finally:
                await producer.close()
        asyncio.run(main())

    assert orders(dsn) == []
    assert rows(dsn) == [("rollback", None)]  # the key fenced: it can never commit later
    assert consume(checked, topic, unique_name("c"), 0) == []


def test_a_transaction_the_server_ended_after_a_commit_inside_the_block_follows_that_commit(
        checked, dsn, unique_name):
    """Against the rules, the caller commits inside the block (the decision row commits with
    its work) and goes on in a new transaction, which the server ends for idling: what ended
    is not the decision's transaction. Its halves follow the row: committed, delivered."""
    group, topic = unique_name("g"), unique_name("orders")
    checked.create_topic(topic, 1)
    with anchored_producer(checked, group, dsn, answer_checks=False) as producer, psycopg.connect(dsn) as conn:
        with pytest.raises(psycopg.errors.IdleInTransactionSessionTimeout):
            with producer.transaction(conn) as tx:
                half = tx.send(txmq.Message(topic, b"committed inside")).result(10)
                conn.execute("INSERT INTO orders VALUES ('o1', 'x')")
                conn.commit()
                # The session's own bound (the SDK's went with the transaction it set it in).
                conn.execute("SELECT set_config('idle_in_transaction_session_timeout', %s, false)",
                             (str(int(IDLE_SECONDS * 1000)),))
                conn.execute("INSERT INTO orders VALUES ('o2', 'x')")  # a new transaction, never committed
                wait_session_ended(dsn, conn.info.backend_pid)
        wait_state(checked, half.transaction_id, COMMITTED, timeout=20)
    assert orders(dsn) == ["o1"]
    assert [m.body for m in consume(checked, topic, unique_name("c"), 1)] == [b"committed inside"]
    wait_until(lambda: rows(dsn) == [], 15, message=lambda: f"decision rows left: {rows(dsn)}")
