"""A producer process for the anchored-transaction crash tests: runs anchored transactions
(sync, psycopg 3), each inserting its order row and sending one message whose body is the
order id, and prints a JSON line per event. ``TXMQ_SDK_FAILPOINT`` (``txmq._anchored``)
makes it SIGKILL itself at a step; the test kills it from outside otherwise.

    python -m tests.support.anchored_worker --nameserver A --dsn D --topic T --group G
           [--orders N | --forever] [--prefix P] [--hold FILE] [--no-checks] [--sqlalchemy]

``--sqlalchemy``: the caller's connection is a SQLAlchemy 2 ``Session`` on psycopg 3 (the
order row an ORM object, flushed by the SDK before its COMMIT) instead of a psycopg
``Connection``. ``--aio``: the same on ``txmq.aio`` (an ``AsyncTransactionProducer``, a
psycopg ``AsyncConnection`` or a SQLAlchemy ``AsyncSession``); ``--stray`` and ``--hold``
are the sync worker's only.

``--hold FILE``: each transaction waits inside its block (after its half is stored) until
FILE exists. ``--stray``: each transaction also stores a second half message with the same
key that it does not commit — what a send attempt given up on leaves behind when the send
moves to another shard (its answer was lost, yet it was stored). Events: {"ready"}, {"half": order, "transaction_id": ...},
{"committed": order, "transaction_id": ...}, {"error": order, "type": ..., "message": ...}.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def emit(**event: object) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nameserver", required=True)
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--orders", type=int, default=1)
    parser.add_argument("--forever", action="store_true")
    parser.add_argument("--prefix", default="o")
    parser.add_argument("--hold", default="")
    parser.add_argument("--no-checks", action="store_true")
    parser.add_argument("--stray", action="store_true")
    parser.add_argument("--sqlalchemy", action="store_true")
    parser.add_argument("--aio", action="store_true")
    args = parser.parse_args()
    if args.aio:
        import asyncio

        asyncio.run(run_async(args))
        return

    import dataclasses

    import txmq
    from txmq.anchored import Decisions

    producer = txmq.TransactionProducer(args.nameserver, producer_group=args.group, checker_refresh_seconds=0.5,
                                        answer_checks=not args.no_checks, send_timeout_seconds=2.0,
                                        decisions=Decisions(args.dsn, repair_after_seconds=1.0,
                                                            sweep_interval_seconds=0.5))
    database = SessionDatabase(args.dsn) if args.sqlalchemy else PsycopgDatabase(args.dsn)
    emit(ready=True)
    n = 0
    while args.forever or n < args.orders:
        order = f"{args.prefix}-{os.getpid()}-{n}"
        n += 1
        try:
            conn = database.connection()
            with producer.transaction(conn) as tx:
                message = txmq.Message(args.topic, order.encode())
                half = tx.send(message)
                if args.stray:
                    stray = dataclasses.replace(message, properties=tx.plan.properties(message.properties))
                    left, _route = producer._send_half(stray)  # the lost attempt, stored
                    emit(stray=order, transaction_id=left.transaction_id)
                database.insert(order)
                if args.hold:
                    stored = half.result()
                    emit(half=order, transaction_id=stored.transaction_id)
                    while not os.path.exists(args.hold):
                        time.sleep(0.01)
            emit(committed=order, transaction_id=tx.result.messages[0].transaction_id)
        except Exception as exc:  # noqa: BLE001 - reported; the loop goes on (a fault is under test)
            emit(error=order, type=type(exc).__name__, message=str(exc)[:300])
            time.sleep(0.05)
    producer.close()
    database.close()
    emit(done=n)


async def run_async(args: argparse.Namespace) -> None:
    """The sync loop's transactions on ``txmq.aio``."""
    import asyncio

    import txmq
    from txmq.aio import AsyncTransactionProducer
    from txmq.anchored import Decisions

    database = AsyncSessionDatabase(args.dsn) if args.sqlalchemy else await AsyncPsycopgDatabase.open(args.dsn)
    async with AsyncTransactionProducer(args.nameserver, producer_group=args.group, checker_refresh_seconds=0.5,
                                        answer_checks=not args.no_checks, send_timeout_seconds=2.0,
                                        decisions=Decisions(args.dsn, repair_after_seconds=1.0,
                                                            sweep_interval_seconds=0.5)) as producer:
        emit(ready=True)
        n = 0
        while args.forever or n < args.orders:
            order = f"{args.prefix}-{os.getpid()}-{n}"
            n += 1
            try:
                conn = await database.connection()
                async with producer.transaction(conn) as tx:
                    tx.send(txmq.Message(args.topic, order.encode()))
                    await database.insert(order)
                emit(committed=order, transaction_id=tx.result.messages[0].transaction_id)
            except Exception as exc:  # noqa: BLE001 - reported; the loop goes on (a fault is under test)
                emit(error=order, type=type(exc).__name__, message=str(exc)[:300])
                await asyncio.sleep(0.05)
    await database.close()
    emit(done=n)


class AsyncPsycopgDatabase:
    """The caller's psycopg ``AsyncConnection`` (a new one once it broke)."""

    def __init__(self, dsn: str, conn) -> None:
        self.dsn, self.conn = dsn, conn

    @classmethod
    async def open(cls, dsn: str) -> "AsyncPsycopgDatabase":
        import psycopg

        return cls(dsn, await psycopg.AsyncConnection.connect(dsn))

    async def connection(self):
        import psycopg

        if self.conn.closed or self.conn.broken:
            self.conn = await psycopg.AsyncConnection.connect(self.dsn)
        return self.conn

    async def insert(self, order: str) -> None:
        await self.conn.execute("INSERT INTO orders (id, body) VALUES (%s, 'x')", (order,))

    async def close(self) -> None:
        await self.conn.close()


class AsyncSessionDatabase:
    """A SQLAlchemy ``AsyncSession`` on psycopg 3; the order row an ORM object."""

    def __init__(self, dsn: str) -> None:
        from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

        self.engine = create_async_engine(sqlalchemy_url(dsn))
        self.order = order_model()
        self.session = AsyncSession(self.engine)

    async def connection(self):
        return self.session

    async def insert(self, order: str) -> None:
        self.session.add(self.order(id=order, body=b"x"))

    async def close(self) -> None:
        await self.session.close()
        await self.engine.dispose()


def sqlalchemy_url(dsn: str):
    import sqlalchemy

    parts = dict(p.split("=", 1) for p in dsn.split())
    return sqlalchemy.URL.create("postgresql+psycopg", username=parts.get("user"), host=parts.get("host"),
                                 port=int(parts["port"]), database=parts.get("dbname"))


def order_model():
    """The ``orders`` table's ORM class."""
    import sqlalchemy
    from sqlalchemy.orm import DeclarativeBase, mapped_column

    class Base(DeclarativeBase):
        pass

    class Order(Base):
        __tablename__ = "orders"
        id = mapped_column(sqlalchemy.Text, primary_key=True)
        body = mapped_column(sqlalchemy.LargeBinary, nullable=False)

    return Order


class PsycopgDatabase:
    """The caller's psycopg ``Connection`` (a new one once it broke)."""

    def __init__(self, dsn: str) -> None:
        import psycopg

        self.dsn, self.conn = dsn, psycopg.connect(dsn)

    def connection(self):
        import psycopg

        if self.conn.closed or self.conn.broken:
            self.conn = psycopg.connect(self.dsn)
        return self.conn

    def insert(self, order: str) -> None:
        self.conn.execute("INSERT INTO orders (id, body) VALUES (%s, 'x')", (order,))

    def close(self) -> None:
        self.conn.close()


class SessionDatabase:
    """A SQLAlchemy ``Session`` on psycopg 3; the order row an ORM object."""

    def __init__(self, dsn: str) -> None:
        import sqlalchemy
        from sqlalchemy.orm import Session

        self.engine = sqlalchemy.create_engine(sqlalchemy_url(dsn))
        self.order = order_model()
        self.session = Session(self.engine)

    def connection(self):
        return self.session

    def insert(self, order: str) -> None:
        self.session.add(self.order(id=order, body=b"x"))

    def close(self) -> None:
        self.session.close()
        self.engine.dispose()


if __name__ == "__main__":
    main()
