"""Orders and their messages, anchored in PostgreSQL (docs/anchored-transactions.md).

Each order is a row in the application's ``shop_orders`` table and a message on a topic, both
or neither: the decision is the database commit; checks are answered from the decisions
table by the producer itself (no check code here). A consumer then receives every order
committed, and the example checks that it got exactly those.

    python examples/anchored_orders.py --nameserver 127.0.0.1:9876 --dsn "dbname=shop" [--asyncio]

The DSN defaults to ``$TXMQ_DECISIONS_DSN``. Exits 0 when the consumer received exactly
the orders committed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import uuid

import psycopg

import txmq
from _common import ensure_topic
from txmq.anchored import Decisions, schema_sql


def setup(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(schema_sql())  # what `txmq db init` runs
        conn.execute("CREATE TABLE IF NOT EXISTS shop_orders (id text PRIMARY KEY, amount int NOT NULL)")


def place_orders(nameserver: str, dsn: str, topic: str, count: int, run: str) -> set[str]:
    placed = set()
    with txmq.TransactionProducer(nameserver, producer_group="anchored-example",
                                  decisions=Decisions(dsn)) as producer, psycopg.connect(dsn) as conn:
        for i in range(count):
            order = f"order-{run}-{i}"
            try:
                with producer.transaction(conn) as tx:
                    tx.send(txmq.Message(topic, order.encode(), keys=(order,)))
                    conn.execute("INSERT INTO shop_orders (id, amount) VALUES (%s, %s)", (order, 10 * i))
                    if i % 3 == 2:
                        raise ValueError("out of stock")  # rolls back the row and the message
            except ValueError:
                continue
            placed.add(order)
            print(f"{order}: {tx.result.state.name}")
    # Closing the producer let the EndTransactions in flight finish.
    return placed


async def place_orders_async(nameserver: str, dsn: str, topic: str, count: int, run: str) -> set[str]:
    from txmq.aio import AsyncTransactionProducer

    async def one(producer: AsyncTransactionProducer, i: int) -> str | None:
        order = f"order-{run}-{i}"
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            try:
                async with producer.transaction(conn) as tx:
                    tx.send(txmq.Message(topic, order.encode(), keys=(order,)))
                    await conn.execute("INSERT INTO shop_orders (id, amount) VALUES (%s, %s)", (order, 10 * i))
                    if i % 3 == 2:
                        raise ValueError("out of stock")
            except ValueError:
                return None
        await tx.result.wait_acknowledged(10)
        print(f"{order}: {tx.result.state.name}")
        return order

    async with AsyncTransactionProducer(nameserver, producer_group="anchored-example",
                                        decisions=Decisions(dsn)) as producer:
        done = await asyncio.gather(*(one(producer, i) for i in range(count)))
    return {o for o in done if o}


def consume(nameserver: str, topic: str, expected: set[str], run: str) -> set[str]:
    """This run's orders received (a new group starts at the earliest message: earlier runs' too)."""
    got: set[str] = set()
    with txmq.SimpleConsumer(nameserver, consumer_group=f"anchored-example-{uuid.uuid4().hex[:6]}",
                             subscriptions={topic: "*"}, await_duration_seconds=1.0) as consumer:
        for _ in range(30):
            batch = consumer.receive(32)
            for m in batch:
                if m.body.decode().startswith(f"order-{run}-"):
                    got.add(m.body.decode())
                consumer.ack(m)
            if got >= expected and not batch:
                break
    return got


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nameserver", default=os.environ.get("TXMQ_NAMESERVER", "127.0.0.1:9876"))
    parser.add_argument("--dsn", default=os.environ.get("TXMQ_DECISIONS_DSN", ""))
    parser.add_argument("--topic", default="anchored-orders")
    parser.add_argument("--count", type=int, default=6)
    parser.add_argument("--asyncio", action="store_true")
    args = parser.parse_args()
    if not args.dsn:
        parser.error("--dsn (or $TXMQ_DECISIONS_DSN) is required")
    setup(args.dsn)
    ensure_topic(args.nameserver, args.topic)
    run = uuid.uuid4().hex[:8]  # this run's orders, told apart from earlier runs' in the topic
    if args.asyncio:
        placed = asyncio.run(place_orders_async(args.nameserver, args.dsn, args.topic, args.count, run))
    else:
        placed = place_orders(args.nameserver, args.dsn, args.topic, args.count, run)
    received = consume(args.nameserver, args.topic, placed, run)
    print(f"placed {len(placed)}, received {len(received)}")
    return 0 if received == placed else 1


if __name__ == "__main__":
    sys.exit(main())
