"""Anchored transactions on a SQLAlchemy 2 ``Session`` / ``AsyncSession`` over psycopg 3,
against a real PostgreSQL and txmq: the decision row's statements travel as on a psycopg
connection (the connection's BEGIN with the INSERT, the UPDATE with the COMMIT: three round
trips on the caller's connection where the Session's own statements made five), the
Session's pending objects are flushed inside the transaction, whatever would reach the
database inside ``Session.commit()`` (a ``before_commit`` listener, an open SAVEPOINT)
keeps the COMMIT the Session's own, and an error of the SDK's own statement reaches the
caller as SQLAlchemy raises it: a lost connection at COMMIT is unknown (the checks decide),
a refused COMMIT an ``IntegrityError``."""

from __future__ import annotations

import asyncio
import logging

import psycopg
import pytest
import sqlalchemy
from sqlalchemy import event, text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column
from sqlalchemy.pool import StaticPool

import txmq
from tests.integration.test_anchored import (ANCHORED_ROUND_TRIPS, ANCHORED_STATEMENTS,  # noqa: F401 - fixtures
                                             WireTrace, anchored_producer, checked, consume, dsn, orders, pg, rows)
from tests.integration.test_anchored_integrations import async_producing, url
from tests.integration.test_checks import ROLLED_BACK, describe, wait_state

pytestmark = pytest.mark.timeout(120)


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"
    id: Mapped[str] = mapped_column(primary_key=True)
    body: Mapped[bytes]


def psycopg_of(session: Session) -> psycopg.Connection:
    return session.connection().connection.driver_connection


def same_transaction(dsn: str, order_id: str) -> bool:
    """Whether the order and every audit row were written by one transaction (one xmin)."""
    with psycopg.connect(dsn) as conn:
        xmins = conn.execute("SELECT xmin::text FROM orders WHERE id = %s UNION SELECT xmin::text FROM audit",
                             (order_id,)).fetchall()
    return len(xmins) == 1


def audited(dsn: str) -> list[str]:
    with psycopg.connect(dsn) as conn:
        return [r[0] for r in conn.execute("SELECT id FROM audit")]


def test_a_sqlalchemy_session_costs_the_callers_connection_three_round_trips(checked, dsn, unique_name, tmp_path):
    """The Session's pending object is flushed before the decision's COMMIT, inside the
    transaction, and ``Session.commit()`` then sends nothing."""
    group, topic = unique_name("g"), unique_name("orders")
    checked.create_topic(topic, 1)
    engine = sqlalchemy.create_engine(url(dsn), poolclass=StaticPool)  # one connection: the one traced
    try:
        with anchored_producer(checked, group, dsn, answer_checks=False) as producer, Session(engine) as session:
            trace = WireTrace(psycopg_of(session), tmp_path / "wire.txt")
            session.rollback()  # back to the pool, from which the block takes it again
            with producer.transaction(session) as tx:
                tx.send(txmq.Message(topic, b"orm"))
                session.add(Order(id="orm-1", body=b"x"))
            statements, round_trips = trace.stop()
            assert tx.result.wait_acknowledged(10), tx.result.end_error
    finally:
        engine.dispose()
    assert orders(dsn) == ["orm-1"]
    assert statements == ANCHORED_STATEMENTS
    assert round_trips == ANCHORED_ROUND_TRIPS
    assert [m.body for m in consume(checked, topic, unique_name("c"), 1)] == [b"orm"]


def test_an_asyncio_sqlalchemy_session_costs_the_callers_connection_three_round_trips(checked, dsn, unique_name,
                                                                                     tmp_path):
    group, topic = unique_name("g"), unique_name("orders")
    checked.create_topic(topic, 1)

    async def main() -> tuple[list[str], int]:
        engine = create_async_engine(url(dsn), poolclass=StaticPool)
        try:
            async with async_producing(checked, group, dsn, answer_checks=False) as producer, \
                    AsyncSession(engine) as session:
                trace = WireTrace((await session.connection()).sync_connection.connection.driver_connection,
                                  tmp_path / "wire.txt")
                await session.rollback()
                async with producer.transaction(session) as tx:
                    tx.send(txmq.Message(topic, b"async-orm"))
                    session.add(Order(id="orm-2", body=b"x"))
                counted = trace.stop()
                assert await tx.result.wait_acknowledged(10), tx.result.end_error
                return counted
        finally:
            await engine.dispose()

    statements, round_trips = asyncio.run(main())
    assert orders(dsn) == ["orm-2"]
    assert statements == ANCHORED_STATEMENTS
    assert round_trips == ANCHORED_ROUND_TRIPS


@pytest.mark.parametrize("late", ["before_commit", "savepoint"])
def test_what_reaches_the_database_inside_session_commit_commits_with_the_transaction(checked, dsn, unique_name,
                                                                                      late):
    """A ``before_commit`` listener's statement, or the RELEASE of a SAVEPOINT left open,
    runs inside ``Session.commit()``: the SDK leaves that COMMIT to the Session, and the
    listener's row commits in the same transaction as the caller's."""
    group, topic = unique_name("g"), unique_name("orders")
    checked.create_topic(topic, 1)
    with psycopg.connect(dsn, autocommit=True) as setup:
        setup.execute("CREATE TABLE audit (id text)")
    engine = sqlalchemy.create_engine(url(dsn))
    try:
        with anchored_producer(checked, group, dsn, answer_checks=False) as producer, Session(engine) as session:
            if late == "before_commit":
                event.listen(session, "before_commit", lambda s: s.execute(text("INSERT INTO audit VALUES ('a')")))
            with producer.transaction(session) as tx:
                tx.send(txmq.Message(topic, b"late"))
                session.execute(text("INSERT INTO orders VALUES ('o1', 'x')"))
                if late == "savepoint":
                    session.begin_nested()
                    session.execute(text("INSERT INTO audit VALUES ('a')"))
            assert tx.result.wait_acknowledged(10), tx.result.end_error
    finally:
        engine.dispose()
    assert orders(dsn) == ["o1"]
    if late == "before_commit":
        assert same_transaction(dsn, "o1")
    else:  # a SAVEPOINT's rows carry its own transaction id: both are there, the RELEASE did not fail
        assert audited(dsn) == ["a"]
    assert [m.body for m in consume(checked, topic, unique_name("c"), 1)] == [b"late"]


@pytest.mark.parametrize("commit", ["sdk", "session", "asyncio-session"])
def test_an_after_commit_listener_that_raises_leaves_the_transaction_committed(checked, dsn, unique_name, commit):
    """A Session's ``after_commit`` listener runs once the database has committed: its
    error reaches the caller as ``Session.commit()`` would raise it, but the messages
    follow the database (COMMITTED, delivered), never rolled back by it — whether the SDK
    sent the COMMIT or the Session did (a ``before_commit`` listener keeps it the
    Session's)."""
    group, topic = unique_name("g"), unique_name("orders")
    checked.create_topic(topic, 1)

    def listen(session: Session) -> None:
        def after(_session: Session) -> None:
            raise LookupError("the cache is down")
        event.listen(session, "after_commit", after)
        if commit != "sdk":
            event.listen(session, "before_commit", lambda _session: None)

    def sync() -> None:
        engine = sqlalchemy.create_engine(url(dsn))
        try:
            with anchored_producer(checked, group, dsn, answer_checks=False) as producer, Session(engine) as session:
                listen(session)
                with pytest.raises(LookupError):
                    with producer.transaction(session) as tx:
                        tx.send(txmq.Message(topic, b"kept"))
                        session.execute(text("INSERT INTO orders VALUES ('o1', 'x')"))
                assert tx.result.state == txmq.TransactionState.COMMITTED
                assert tx.result.wait_acknowledged(10), tx.result.end_error
        finally:
            engine.dispose()

    async def asyncio_() -> None:
        engine = create_async_engine(url(dsn))
        try:
            async with async_producing(checked, group, dsn, answer_checks=False) as producer, \
                    AsyncSession(engine) as session:
                listen(session.sync_session)
                with pytest.raises(LookupError):
                    async with producer.transaction(session) as tx:
                        tx.send(txmq.Message(topic, b"kept"))
                        await session.execute(text("INSERT INTO orders VALUES ('o1', 'x')"))
                assert tx.result.state == txmq.TransactionState.COMMITTED
                assert await tx.result.wait_acknowledged(10), tx.result.end_error
        finally:
            await engine.dispose()

    sync() if commit != "asyncio-session" else asyncio.run(asyncio_())
    assert orders(dsn) == ["o1"]
    assert [m.body for m in consume(checked, topic, unique_name("c"), 1)] == [b"kept"]


def test_a_commit_the_database_refuses_reaches_a_session_as_sqlalchemy_raises_it(checked, dsn, unique_name):
    """A deferred constraint fails at the COMMIT the SDK sent: the caller gets SQLAlchemy's
    ``IntegrityError`` (the driver's error as ``orig``), the half is rolled back, and the
    Session is usable."""
    group, topic = unique_name("g"), unique_name("orders")
    checked.create_topic(topic, 1)
    with psycopg.connect(dsn, autocommit=True) as setup:
        setup.execute("CREATE TABLE once (id text, CONSTRAINT once_id UNIQUE (id) DEFERRABLE INITIALLY DEFERRED)")
    engine = sqlalchemy.create_engine(url(dsn))
    try:
        with anchored_producer(checked, group, dsn) as producer, Session(engine) as session:
            with pytest.raises(sqlalchemy.exc.IntegrityError) as raised:
                with producer.transaction(session) as tx:
                    half = tx.send(txmq.Message(topic, b"never"))
                    session.execute(text("INSERT INTO orders VALUES ('o1', 'x')"))
                    session.execute(text("INSERT INTO once VALUES ('a'), ('a')"))  # checked at COMMIT
            assert isinstance(raised.value.orig, psycopg.errors.UniqueViolation)
            assert tx.result is None
            wait_state(checked, half.result().transaction_id, ROLLED_BACK)
            assert session.execute(text("SELECT 1")).scalar() == 1
            session.rollback()
    finally:
        engine.dispose()
    assert orders(dsn) == [] and rows(dsn) == []


def terminate(dsn: str, pid: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as other:
        assert other.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone() == (True,)


@pytest.mark.parametrize("flavour", ["sync", "asyncio"])
def test_a_session_whose_connection_is_lost_at_commit_leaves_the_decision_to_the_checks(checked, dsn, unique_name,
                                                                                        caplog, flavour):
    """The connection dies before the SDK's UPDATE and COMMIT: the outcome is unknown (it
    may have committed), so the SDK hints nothing and says so; the check finds no row,
    fences the key and rolls the half back. The caller gets SQLAlchemy's
    ``OperationalError``."""
    group, topic = unique_name("g"), unique_name("orders")
    checked.create_topic(topic, 1)
    caplog.set_level(logging.WARNING, logger="txmq")

    def sync() -> str:
        engine = sqlalchemy.create_engine(url(dsn))
        try:
            with anchored_producer(checked, group, dsn) as producer, Session(engine) as session:
                with pytest.raises(sqlalchemy.exc.OperationalError):
                    with producer.transaction(session) as tx:
                        half = tx.send(txmq.Message(topic, b"lost"))
                        session.execute(text("INSERT INTO orders VALUES ('o1', 'x')"))
                        terminate(dsn, psycopg_of(session).info.backend_pid)
                assert tx.result is None
                transaction_id = half.result().transaction_id
                wait_state(checked, transaction_id, ROLLED_BACK, timeout=30)  # answered by this producer's check
                return transaction_id
        finally:
            engine.dispose()

    async def asyncio_() -> str:
        engine = create_async_engine(url(dsn))
        try:
            async with async_producing(checked, group, dsn) as producer, AsyncSession(engine) as session:
                with pytest.raises(sqlalchemy.exc.OperationalError):
                    async with producer.transaction(session) as tx:
                        half = tx.send(txmq.Message(topic, b"lost"))
                        await session.execute(text("INSERT INTO orders VALUES ('o1', 'x')"))
                        driver = (await session.connection()).sync_connection.connection.driver_connection
                        await asyncio.to_thread(terminate, dsn, driver.info.backend_pid)
                assert tx.result is None
                transaction_id = (await half).transaction_id
                await asyncio.to_thread(wait_state, checked, transaction_id, ROLLED_BACK, 30)
                return transaction_id
        finally:
            await engine.dispose()

    transaction_id = sync() if flavour == "sync" else asyncio.run(asyncio_())
    assert any("the COMMIT's answer was lost" in r.getMessage() for r in caplog.records), \
        [r.getMessage() for r in caplog.records]
    assert describe(checked, transaction_id).state == ROLLED_BACK
    assert orders(dsn) == []
    assert rows(dsn) == [("rollback", None)]  # the check's fence: the key can never commit now
