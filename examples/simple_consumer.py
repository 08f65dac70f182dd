"""Sends a few messages, then receives and acknowledges them with a SimpleConsumer.

    python examples/simple_consumer.py --nameserver 127.0.0.1:9876

Exits 0 once every message sent was received (within 30 seconds).
"""

from __future__ import annotations

import sys
import time
import uuid

import txmq
from _common import arguments, ensure_topic


def main() -> int:
    args = arguments(__doc__.splitlines()[0], "TopicSimple")
    ensure_topic(args.nameserver, args.topic)
    run = uuid.uuid4().hex[:8]
    with txmq.Producer(args.nameserver) as producer:
        sent = {}
        for i in range(args.count):
            receipt = producer.send(txmq.Message(args.topic, f"hello {run} {i}".encode(), tag="TagA"))
            sent[receipt.message_id] = receipt
            print(f"sent {receipt.message_id} to {receipt.broker_name} queue {receipt.queue_id} "
                  f"offset {receipt.queue_offset}")

    # A new group starts from the earliest retained message: messages of earlier runs come
    # too, and are acknowledged like the rest.
    group = f"example-{run}"
    deadline = time.monotonic() + 30.0
    with txmq.SimpleConsumer(args.nameserver, consumer_group=group, subscriptions={args.topic: "TagA"},
                             await_duration_seconds=2.0) as consumer:
        while sent and time.monotonic() < deadline:
            for message in consumer.receive(max_messages=16, invisible_duration_seconds=15.0):
                if sent.pop(message.message_id, None) is not None:
                    print(f"received {message.body.decode()!r} (attempt {message.delivery_attempt}) "
                          f"from {message.broker_name} queue {message.queue_id} offset {message.queue_offset}")
                consumer.ack(message)
    if sent:
        print(f"not received within 30s: {sorted(sent)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
