"""A push consumer: the listener is called for each message on a thread pool; SUCCESS
acknowledges, FAILURE (or an exception) has the message redelivered after a backoff.

    python examples/push_consumer.py --nameserver 127.0.0.1:9876

The listener fails every message's first delivery on purpose. Exits 0 when every message
was consumed, each on its second delivery.
"""

from __future__ import annotations

import sys
import threading
import uuid

import txmq
from _common import arguments, ensure_topic


def main() -> int:
    args = arguments(__doc__.splitlines()[0], "TopicPush")
    ensure_topic(args.nameserver, args.topic)
    run = uuid.uuid4().hex[:8]
    with txmq.Producer(args.nameserver) as producer:
        sent = {producer.send(txmq.Message(args.topic, f"job {run} {i}".encode())).message_id
                for i in range(args.count)}
    consumed: dict[str, int] = {}
    lock = threading.Lock()
    all_done = threading.Event()

    def listener(message: txmq.ReceivedMessage) -> txmq.ConsumeResult:
        if message.message_id not in sent:
            return txmq.ConsumeResult.SUCCESS  # an earlier run's message
        if message.delivery_attempt == 1:
            raise RuntimeError("first delivery fails")  # logged; redelivered after the backoff
        with lock:
            consumed[message.message_id] = message.delivery_attempt
            if len(consumed) == len(sent):
                all_done.set()
        return txmq.ConsumeResult.SUCCESS

    with txmq.PushConsumer(args.nameserver, consumer_group=f"push-example-{run}", subscriptions={args.topic: "*"},
                           listener=listener, consume_threads=4, retry_backoff_seconds=0.2,
                           await_duration_seconds=1.0):
        all_done.wait(30)
    print(f"consumed {len(consumed)} of {len(sent)}, attempts {sorted(set(consumed.values()))}")
    return 0 if len(consumed) == len(sent) and set(consumed.values()) == {2} else 1


if __name__ == "__main__":
    sys.exit(main())
