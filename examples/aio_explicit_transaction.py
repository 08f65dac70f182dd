"""An explicit transaction with asyncio: ``async with producer.begin_transaction(key=...)``,
half messages sent with ``await producer.send(message, tx)``, a checker coroutine that
answers by the key, and ``async for`` over a consumer.

    python examples/aio_explicit_transaction.py --nameserver 127.0.0.1:9876

Orders are placed concurrently; one fails on purpose and its messages roll back. Exits 0
when the consumer receives exactly the messages of the orders that committed.
"""

from __future__ import annotations

import asyncio
import sys
import uuid

import txmq
from _common import arguments, ensure_topic
from txmq.aio import AsyncSimpleConsumer, AsyncTransactionProducer

LocalState = txmq.LocalTransactionState
committed: set[str] = set()  # stands for the application's database


async def check(message: txmq.TransactionMessage) -> LocalState:
    return LocalState.COMMIT if message.transaction_key in committed else LocalState.ROLLBACK


async def place(producer: AsyncTransactionProducer, topic: str, order: str, fail: bool) -> set[bytes]:
    try:
        async with producer.begin_transaction(key=order) as tx:
            await producer.send(txmq.Message(topic, f"{order} created".encode()), tx)
            await producer.send(txmq.Message(topic, f"{order} reserved".encode()), tx)
            if fail:
                raise ValueError("out of stock")
            committed.add(order)
    except ValueError as err:
        print(f"{order}: rolled back ({err})")
        return set()
    print(f"{order}: committed")
    return {f"{order} created".encode(), f"{order} reserved".encode()}


async def main() -> int:
    args = arguments(__doc__.splitlines()[0], "OrdersExplicitAsync")
    ensure_topic(args.nameserver, args.topic)
    run = uuid.uuid4().hex[:8]
    async with AsyncTransactionProducer(args.nameserver, producer_group="aio-explicit-example",
                                        checker=check) as producer:
        placed = await asyncio.gather(*(place(producer, args.topic, f"order-{run}-{i}", i == 1)
                                        for i in range(args.count)))
    expected = set().union(*placed)

    got: set[bytes] = set()

    async def consume() -> None:
        async with AsyncSimpleConsumer(args.nameserver, consumer_group=f"aio-explicit-{run}",
                                       subscriptions={args.topic: "*"}, await_duration_seconds=1.0) as consumer:
            async for message in consumer:
                if message.body.startswith(f"order-{run}".encode()):
                    got.add(message.body)
                await consumer.ack(message)
                if got >= expected:
                    return

    try:
        await asyncio.wait_for(consume(), 30)
    except TimeoutError:
        pass
    print(f"received {len(got)} of {len(expected)} committed messages")
    return 0 if got == expected else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
