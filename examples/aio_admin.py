"""The Admin API from asyncio (``txmq.aio.AsyncAdmin``): the operations of ``txmq.Admin``,
awaited — here a topic's life and a consumer group's lag, with calls made concurrently.

    python examples/aio_admin.py --nameserver 127.0.0.1:9876

Exits 0 when the lag seen drops to 0 once the group consumed what was sent.
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid

import txmq
from _common import arguments
from txmq.aio import AsyncAdmin, AsyncProducer, AsyncSimpleConsumer


async def main() -> int:
    args = arguments(__doc__.splitlines()[0], "AdminAsync")
    run = uuid.uuid4().hex[:8]
    topic, group = f"{args.topic}-{run}", f"aio-admin-example-{run}"
    async with AsyncAdmin(args.nameserver) as admin:
        await admin.create_topic(topic, queue_count=2)
        async with AsyncProducer(args.nameserver) as producer:
            await asyncio.gather(*(producer.send(txmq.Message(topic, b"%d" % i)) for i in range(args.count)))
        async with AsyncSimpleConsumer(args.nameserver, consumer_group=group, subscriptions={topic: "*"},
                                       await_duration_seconds=1.0) as consumer:
            topics, brokers = await asyncio.gather(admin.list_topics(), admin.list_brokers())
            print("topics:", len(topics.topics), "brokers:", [b.name for b in brokers.brokers])
            received = 0
            deadline = time.monotonic() + 30
            while received < args.count and time.monotonic() < deadline:
                batch = await consumer.receive(16)
                await consumer.ack_many(batch)
                received += len(batch)
        lag = -1
        deadline = time.monotonic() + 10
        while lag != 0 and time.monotonic() < deadline:
            lag = sum(q.lag_messages for q in (await admin.consumer_groups(group)).queues)
        print(f"group {group}: lag {lag}")
        await admin.delete_topic(topic, force=True)
    return 0 if lag == 0 else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
