"""An asyncio push consumer: ``async def listener(message)`` runs for each message (at most
``consume_concurrency`` at once); SUCCESS acknowledges, FAILURE or an exception retries.

    python examples/aio_push_consumer.py --nameserver 127.0.0.1:9876

The listener awaits (stands for an HTTP call) and fails each message's first delivery on
purpose. Exits 0 when every message was consumed, each on its second delivery.
"""

from __future__ import annotations

import asyncio
import sys
import uuid

import txmq
from _common import arguments, ensure_topic
from txmq.aio import AsyncProducer, AsyncPushConsumer


async def main() -> int:
    args = arguments(__doc__.splitlines()[0], "TopicPushAsync")
    ensure_topic(args.nameserver, args.topic)
    run = uuid.uuid4().hex[:8]
    async with AsyncProducer(args.nameserver) as producer:
        receipts = await asyncio.gather(*(producer.send(txmq.Message(args.topic, f"job {run} {i}".encode()))
                                          for i in range(args.count)))
    sent = {r.message_id for r in receipts}
    consumed: dict[str, int] = {}
    all_done = asyncio.Event()

    async def listener(message: txmq.ReceivedMessage) -> txmq.ConsumeResult:
        if message.message_id not in sent:
            return txmq.ConsumeResult.SUCCESS
        await asyncio.sleep(0.01)  # the work: an await, never a blocking call
        if message.delivery_attempt == 1:
            raise RuntimeError("first delivery fails")
        consumed[message.message_id] = message.delivery_attempt
        if len(consumed) == len(sent):
            all_done.set()
        return txmq.ConsumeResult.SUCCESS

    async with AsyncPushConsumer(args.nameserver, consumer_group=f"aio-push-example-{run}",
                                 subscriptions={args.topic: "*"}, listener=listener, consume_concurrency=8,
                                 retry_backoff_seconds=0.2, await_duration_seconds=1.0):
        try:
            await asyncio.wait_for(all_done.wait(), 30)
        except TimeoutError:
            pass
    print(f"consumed {len(consumed)} of {len(sent)}, attempts {sorted(set(consumed.values()))}")
    return 0 if len(consumed) == len(sent) and set(consumed.values()) == {2} else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
