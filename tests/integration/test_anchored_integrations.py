"""Anchored transactions through each integration against a real PostgreSQL and txmq:
psycopg 3 ``AsyncConnection`` (asyncio producer), SQLAlchemy 2 ``Session`` and
``AsyncSession``, a plain DB-API connection (:class:`txmq.anchored.DBAPIConnection`), and
the producer's own connections from a SQLAlchemy engine or a factory. Each commits (one
message consumed, the business row present, the decision row gone) and rolls back (no
message, no row); the asyncio one also answers a check from the table while the
transaction is open elsewhere (IN_PROGRESS), then commits."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any, AsyncIterator

import psycopg
import pytest
import sqlalchemy
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

import txmq
import txmq._produce_stream
from tests.integration.test_anchored import (ANCHORED_ROUND_TRIPS, ANCHORED_STATEMENTS,  # noqa: F401 - fixtures
                                             SHOW_TRANSACTION, TRANSACTION_SETTINGS, TRANSACTION_SHOWN, WireTrace,
                                             checked, consume, dsn, end_calls, orders, pg, rows)
from tests.integration.test_checks import COMMITTED, ROLLED_BACK, describe, wait_state
from tests.support.metrics import metric_sum
from tests.support.waiting import wait_until
from txmq.aio import AsyncTransactionProducer
from txmq.anchored import DBAPIConnection, Decisions

pytestmark = pytest.mark.timeout(120)


def url(dsn: str, driver: str = "psycopg") -> str:
    parts = dict(p.split("=", 1) for p in dsn.split())
    return f"postgresql+{driver}://{parts['user']}@{parts['host']}:{parts['port']}/{parts['dbname']}"


@contextlib.asynccontextmanager
async def async_producing(cluster, group: str, source, answer_checks: bool = True,
                          **options) -> AsyncIterator[AsyncTransactionProducer]:
    """:func:`async_producer`, closed when the block ends."""
    producer = await async_producer(cluster, group, source, answer_checks, **options)
    try:
        yield producer
    finally:
        await producer.close()


async def async_producer(cluster, group: str, source, answer_checks: bool = True, **options):
    p = AsyncTransactionProducer(cluster.nameserver_address, producer_group=group, checker_refresh_seconds=0.5,
                                 answer_checks=answer_checks,
                                 decisions=Decisions(source, in_progress_retry_seconds=0.2, **options))
    await p.start()
    if answer_checks:
        deadline = asyncio.get_running_loop().time() + 10
        while len(p.connected_checkers()) < len(cluster.checkers):
            assert asyncio.get_running_loop().time() < deadline, "not subscribed to the checkers"
            await asyncio.sleep(0.05)
    return p


def test_asyncio_psycopg_commit_rollback_and_a_check_while_open(checked, dsn, unique_name):
    group, topic = unique_name("g"), unique_name("orders")
    checked.create_topic(topic, 2)

    async def main() -> tuple[str, str, str]:
        sender = await async_producer(checked, group, dsn, answer_checks=False)
        answerer = await async_producer(checked, group, dsn, check_lock_timeout_seconds=0.05)
        try:
            async with await psycopg.AsyncConnection.connect(dsn) as conn:
                async with sender.transaction(conn) as tx:
                    tx.send(txmq.Message(topic, b"async-1"))
                    await conn.execute("INSERT INTO orders VALUES ('a1', 'x')")
                assert tx.result.state is txmq.TransactionState.COMMITTED
                assert await tx.result.wait_acknowledged(10), tx.result.end_error
                committed = tx.result.messages[0].transaction_id

                with pytest.raises(ZeroDivisionError):
                    async with sender.transaction(conn) as tx2:
                        half = tx2.send(txmq.Message(topic, b"never"))
                        await conn.execute("INSERT INTO orders VALUES ('a2', 'x')")
                        raise ZeroDivisionError
                rolled = (await half).transaction_id

                async with sender.transaction(conn) as tx3:
                    slow = await tx3.send(txmq.Message(topic, b"async-slow"))
                    await asyncio.to_thread(wait_until, lambda: describe(checked, slow.transaction_id)
                                            .checks_answered >= 2, 15)
                    assert describe(checked, slow.transaction_id).state != ROLLED_BACK
                    await conn.execute("INSERT INTO orders VALUES ('a3', 'x')")
                return committed, rolled, slow.transaction_id
        finally:
            await sender.close()
            await answerer.close()

    committed, rolled, slow = asyncio.run(main())
    assert describe(checked, committed).state == COMMITTED
    wait_state(checked, rolled, ROLLED_BACK)
    wait_state(checked, slow, COMMITTED)
    assert orders(dsn) == ["a1", "a3"]
    wait_until(lambda: rows(dsn) == [], 10, message=lambda: f"decision rows left: {rows(dsn)}")
    assert sorted(m.body for m in consume(checked, topic, unique_name("c"), 2)) == [b"async-1", b"async-slow"]


@pytest.mark.parametrize("autocommit", [False, True], ids=["transactional", "autocommit"])
def test_an_asyncio_anchored_transaction_costs_the_callers_connection_three_round_trips(
        checked, dsn, unique_name, tmp_path, autocommit):
    group, topic = unique_name("g"), unique_name("orders")
    checked.create_topic(topic, 1)

    async def main() -> tuple[list[str], int]:
        async with async_producing(checked, group, dsn, answer_checks=False) as producer:
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=autocommit) as conn:
                trace = WireTrace(conn, tmp_path / "wire.txt")
                async with producer.transaction(conn) as tx:
                    tx.send(txmq.Message(topic, b"counted"))
                    await conn.execute("INSERT INTO orders VALUES (%s, 'x')", (f"c-{autocommit}",))
                counted = trace.stop()
                assert await tx.result.wait_acknowledged(10), tx.result.end_error
                return counted

    statements, round_trips = asyncio.run(main())
    assert statements == ANCHORED_STATEMENTS
    assert round_trips == ANCHORED_ROUND_TRIPS


@pytest.mark.parametrize("autocommit", [False, True], ids=["transactional", "autocommit"])
def test_an_asyncio_anchored_transaction_begins_with_the_connections_isolation_level(checked, dsn, unique_name,
                                                                                     autocommit):
    group, topic = unique_name("g"), unique_name("orders")
    checked.create_topic(topic, 1)

    async def main() -> tuple[Any, ...]:
        async with async_producing(checked, group, dsn, answer_checks=False) as producer:
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=autocommit) as conn:
                for name, value in TRANSACTION_SETTINGS.items():
                    await getattr(conn, f"set_{name}")(value)
                async with producer.transaction(conn) as tx:
                    tx.send(txmq.Message(topic, b"isolated"))
                    shown = await (await conn.execute(SHOW_TRANSACTION)).fetchone()
                    await conn.execute("INSERT INTO orders VALUES (%s, 'x')", (f"aiso-{autocommit}",))
                assert await tx.result.wait_acknowledged(10), tx.result.end_error
                return shown

    assert asyncio.run(main()) == TRANSACTION_SHOWN
    assert orders(dsn).count(f"aiso-{autocommit}") == 1


def test_an_asyncio_anchored_transaction_on_a_connection_in_pipeline_mode_commits(checked, dsn, unique_name):
    group, topic = unique_name("g"), unique_name("orders")
    checked.create_topic(topic, 1)

    async def main() -> None:
        async with async_producing(checked, group, dsn, answer_checks=False) as producer:
            async with await psycopg.AsyncConnection.connect(dsn) as conn, conn.pipeline():
                async with producer.transaction(conn) as tx:
                    tx.send(txmq.Message(topic, b"apiped"))
                    await conn.execute("INSERT INTO orders VALUES ('apiped', 'x')")
            assert await tx.result.wait_acknowledged(10), tx.result.end_error

    asyncio.run(main())
    assert orders(dsn).count("apiped") == 1
    assert [m.body for m in consume(checked, topic, unique_name("c"), 1)] == [b"apiped"]


def test_the_end_of_an_asyncio_anchored_transaction_rides_the_produce_stream(checked, dsn, unique_name):
    group, topic = unique_name("g"), unique_name("orders")
    checked.create_topic(topic, 1)

    async def main() -> None:
        async with async_producing(checked, group, dsn, answer_checks=False) as producer:
            async with await psycopg.AsyncConnection.connect(dsn) as conn:
                for i in range(3):
                    async with producer.transaction(conn) as tx:
                        tx.send(txmq.Message(topic, b"streamed"))
                        await conn.execute("INSERT INTO orders VALUES (%s, 'x')", (f"s{i}",))
                    assert await tx.result.wait_acknowledged(10), tx.result.end_error

    unary_before, entries_before = end_calls(checked)
    asyncio.run(main())
    unary_after, entries_after = end_calls(checked)
    assert unary_after == unary_before
    assert entries_after - entries_before >= 3


def test_an_asyncio_caller_alone_sends_its_half_in_the_message_of_its_last_end(checked, dsn, unique_name,
                                                                              monkeypatch):
    """Back-to-back anchored transactions of one coroutine: the previous end (a hint on the
    Produce stream that nobody's critical path waits on) lingers unsent for a moment, and
    the next half, instead of going direct, shares its stream message: one gRPC message and
    one WAL sync for both (docs/performance.md). Before, every half went direct and every
    end alone: two messages per transaction."""
    group, topic = unique_name("g"), unique_name("orders")
    checked.create_topic(topic, 1)
    n = 8
    # Counted, not timed: a linger no load runs out between an end and the next half.
    monkeypatch.setattr(txmq._produce_stream, "HINT_LINGER_SECONDS", 1.0)

    async def main() -> list[Any]:
        results = []
        async with async_producing(checked, group, dsn, answer_checks=False) as producer, \
                await psycopg.AsyncConnection.connect(dsn) as conn:
            for i in range(n):
                async with producer.transaction(conn) as tx:
                    tx.send(txmq.Message(topic, b"shared"))
                    await conn.execute("INSERT INTO orders VALUES (%s, 'x')", (f"d{i}",))
                results.append(tx.result)
            for result in results:
                assert await result.wait_acknowledged(10), result.end_error
        return results

    port = checked.brokers[0].metrics_port

    def messages() -> tuple[float, float]:
        return (metric_sum(port, "txmq_rpc_duration_seconds_count", {"method": "SendMessage"}),
                metric_sum(port, "txmq_produce_stream_messages_total", {"direction": "in"}))

    before = messages()
    asyncio.run(main())
    sends, streamed = (after - was for after, was in zip(messages(), before))
    # The first half goes direct, each later one with the end before it, the last end alone:
    # n + 1 messages (2n before).
    assert sends + streamed <= n + 1, f"{sends:.0f} unary sends and {streamed:.0f} stream messages for {n}"
    assert sends < n, f"{sends:.0f} of {n} halves went direct"


def test_an_awaited_asyncio_end_never_lingers_as_a_hint(checked, dsn, unique_name, monkeypatch):
    """As the sync test_an_awaited_end_never_lingers_as_a_hint: an end the caller awaits is
    no hint (the hint linger is patched to a minute here)."""
    monkeypatch.setattr(txmq._produce_stream, "HINT_LINGER_SECONDS", 60.0)
    group, topic = unique_name("g"), unique_name("orders")
    checked.create_topic(topic, 1)

    async def main() -> float:
        async with async_producing(checked, group, dsn, answer_checks=False) as producer, \
                await psycopg.AsyncConnection.connect(dsn) as conn:
            started = time.monotonic()
            async with producer.transaction(conn, end="await") as tx:
                tx.send(txmq.Message(topic, b"awaited"))
            assert tx.result.acknowledged
            return time.monotonic() - started

    assert asyncio.run(main()) < 20


def test_sqlalchemy_session_with_an_engine_as_the_source(checked, dsn, unique_name):
    group, topic = unique_name("g"), unique_name("orders")
    checked.create_topic(topic, 1)
    engine = sqlalchemy.create_engine(url(dsn))
    try:
        with txmq.TransactionProducer(checked.nameserver_address, producer_group=group,
                                      decisions=Decisions(engine)) as producer, Session(engine) as session:
            with producer.transaction(session) as tx:
                tx.send(txmq.Message(topic, b"sa-1"))
                session.execute(sqlalchemy.text("INSERT INTO orders VALUES ('s1', 'x')"))
            assert tx.result.wait_acknowledged(10), tx.result.end_error
            with pytest.raises(KeyError):
                with producer.transaction(session) as tx2:
                    half = tx2.send(txmq.Message(topic, b"never"))
                    session.execute(sqlalchemy.text("INSERT INTO orders VALUES ('s2', 'x')"))
                    raise KeyError("no")
            wait_state(checked, half.result().transaction_id, ROLLED_BACK)
            wait_until(lambda: rows(dsn) == [], 10, message=lambda: f"decision rows left: {rows(dsn)}")
    finally:
        engine.dispose()
    assert orders(dsn) == ["s1"]
    assert [m.body for m in consume(checked, topic, unique_name("c"), 1)] == [b"sa-1"]


def test_sqlalchemy_async_session(checked, dsn, unique_name):
    group, topic = unique_name("g"), unique_name("orders")
    checked.create_topic(topic, 1)

    async def main() -> None:
        engine = create_async_engine(url(dsn))
        async with async_producing(checked, group, engine) as producer:
            async with AsyncSession(engine) as session:
                async with producer.transaction(session) as tx:
                    tx.send(txmq.Message(topic, b"asa-1"))
                    await session.execute(sqlalchemy.text("INSERT INTO orders VALUES ('x1', 'x')"))
                assert await tx.result.wait_acknowledged(10), tx.result.end_error
            await engine.dispose()

    asyncio.run(main())
    assert orders(dsn) == ["x1"]
    wait_until(lambda: rows(dsn) == [], 10, message=lambda: f"decision rows left: {rows(dsn)}")


def test_sqlalchemy_async_session_on_asyncpg(checked, dsn, unique_name):
    """SQLAlchemy's asyncpg dialect, for the caller's Session and the producers' own
    connections: a commit, a block that raises (rolled back), a COMMIT the database refuses
    (SQLAlchemy's IntegrityError, the half rolled back, the Session usable), and a check
    while the transaction is open, answered IN_PROGRESS from the table by another instance
    on asyncpg, then the commit."""
    group, topic = unique_name("g"), unique_name("orders")
    checked.create_topic(topic, 1)
    with psycopg.connect(dsn, autocommit=True) as setup:
        setup.execute("CREATE TABLE once (id text, CONSTRAINT once_id UNIQUE (id) DEFERRABLE INITIALLY DEFERRED)")
    text = sqlalchemy.text

    async def main() -> tuple[str, str, str, str]:
        engine = create_async_engine(url(dsn, "asyncpg"))
        try:
            async with async_producing(checked, group, engine, answer_checks=False) as sender, \
                    async_producing(checked, group, engine, check_lock_timeout_seconds=0.05):
                async with AsyncSession(engine) as session:
                    async with sender.transaction(session) as tx:
                        tx.send(txmq.Message(topic, b"apg-1"))
                        await session.execute(text("INSERT INTO orders VALUES ('p1', 'x')"))
                    assert await tx.result.wait_acknowledged(10), tx.result.end_error
                    committed = tx.result.messages[0].transaction_id

                    with pytest.raises(ZeroDivisionError):
                        async with sender.transaction(session) as tx2:
                            half = tx2.send(txmq.Message(topic, b"never"))
                            await session.execute(text("INSERT INTO orders VALUES ('p2', 'x')"))
                            raise ZeroDivisionError
                    rolled = (await half).transaction_id

                    with pytest.raises(sqlalchemy.exc.IntegrityError):
                        async with sender.transaction(session) as tx3:
                            refused = tx3.send(txmq.Message(topic, b"never either"))
                            await session.execute(text("INSERT INTO orders VALUES ('p3', 'x')"))
                            await session.execute(text("INSERT INTO once VALUES ('a'), ('a')"))  # at COMMIT
                    refused_id = (await refused).transaction_id
                    assert (await session.execute(text("SELECT 1"))).scalar() == 1
                    await session.rollback()

                    async with sender.transaction(session) as tx4:
                        slow = await tx4.send(txmq.Message(topic, b"apg-slow"))
                        await asyncio.to_thread(wait_until, lambda: describe(checked, slow.transaction_id)
                                                .checks_answered >= 2, 15)
                        assert describe(checked, slow.transaction_id).state != ROLLED_BACK
                        await session.execute(text("INSERT INTO orders VALUES ('p4', 'x')"))
                    assert await tx4.result.wait_acknowledged(10), tx4.result.end_error
                return committed, rolled, refused_id, slow.transaction_id
        finally:
            await engine.dispose()

    committed, rolled, refused, slow = asyncio.run(main())
    assert describe(checked, committed).state == COMMITTED
    wait_state(checked, rolled, ROLLED_BACK)
    wait_state(checked, refused, ROLLED_BACK)
    wait_state(checked, slow, COMMITTED)
    assert orders(dsn) == ["p1", "p4"]
    wait_until(lambda: rows(dsn) == [], 10, message=lambda: f"decision rows left: {rows(dsn)}")
    assert sorted(m.body for m in consume(checked, topic, unique_name("c"), 2)) == [b"apg-1", b"apg-slow"]


def test_a_dbapi_connection_and_a_factory_source(checked, dsn, unique_name):
    """psycopg used only through its DB-API face (cursor/commit/rollback) stands for any
    PostgreSQL DB-API driver; the producer's own connections come from a factory."""
    group, topic = unique_name("g"), unique_name("orders")
    checked.create_topic(topic, 1)
    raw = psycopg.connect(dsn)
    conn = DBAPIConnection(raw, paramstyle="format")
    with txmq.TransactionProducer(checked.nameserver_address, producer_group=group,
                                  decisions=Decisions(lambda: psycopg.connect(dsn))) as producer:
        with producer.transaction(conn) as tx:
            tx.send(txmq.Message(topic, b"dbapi-1"))
            raw.cursor().execute("INSERT INTO orders VALUES ('d1', 'x')")
        assert tx.result.wait_acknowledged(10), tx.result.end_error
        wait_until(lambda: rows(dsn) == [], 10, message=lambda: f"decision rows left: {rows(dsn)}")
    raw.close()
    assert orders(dsn) == ["d1"]


def test_a_dbapi_connection_whose_final_statement_fails_is_usable_after(checked, dsn, unique_name):
    """The decision row's last statement (recording the halves, sent with the COMMIT) fails
    on a DB-API connection: the caller gets the driver's error, the half is rolled back, and
    the connection is rolled back with it — before, it was left in the aborted transaction
    and its next statement failed (InFailedSqlTransaction)."""
    group, topic = unique_name("g"), unique_name("orders")
    checked.create_topic(topic, 1)
    with psycopg.connect(dsn, autocommit=True) as setup:
        setup.execute("CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS "
                      "$$ BEGIN RAISE EXCEPTION 'refused by a trigger'; END $$")
        setup.execute(f"CREATE TRIGGER refuse BEFORE UPDATE ON txmq_decisions FOR EACH ROW "
                      f"WHEN (NEW.producer_group = '{group}') EXECUTE FUNCTION refuse()")
    raw = psycopg.connect(dsn)
    conn = DBAPIConnection(raw, paramstyle="format")
    with txmq.TransactionProducer(checked.nameserver_address, producer_group=group,
                                  decisions=Decisions(lambda: psycopg.connect(dsn))) as producer:
        with pytest.raises(psycopg.errors.RaiseException, match="refused by a trigger"):
            with producer.transaction(conn) as tx:
                half = tx.send(txmq.Message(topic, b"never"))
                raw.cursor().execute("INSERT INTO orders VALUES ('d1', 'x')")
        assert tx.result is None
        wait_state(checked, half.result().transaction_id, ROLLED_BACK)
        cursor = raw.cursor()
        cursor.execute("SELECT 1")
        assert cursor.fetchone() == (1,)
        raw.rollback()
    raw.close()
    assert orders(dsn) == [] and rows(dsn) == []


@pytest.mark.parametrize("flavour", [[], ["--asyncio"]], ids=["sync", "asyncio"])
def test_the_anchored_example_runs(checked, dsn, unique_name, flavour):
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "examples" / "anchored_orders.py"
    done = subprocess.run([sys.executable, str(script), "--nameserver", checked.nameserver_address, "--dsn", dsn,
                           "--topic", unique_name("ex"), *flavour], capture_output=True, text=True, timeout=120,
                          env={**os.environ})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "placed 4, received 4" in done.stdout
    wait_until(lambda: rows(dsn) == [], 10, message=lambda: f"decision rows left: {rows(dsn)}")
