"""Filtering on message properties with SQL92 (RocketMQ's ``MessageSelector.bySql``): a
consumer group subscribed with ``txmq.SqlFilter("region = 'eu' AND amount > 100")``
receives only the messages whose properties match.

    python examples/sql_filter.py --nameserver 127.0.0.1:9876

Exits 0 when the group received exactly the matching messages.
"""

from __future__ import annotations

import sys
import time
import uuid

import txmq
from _common import arguments, ensure_topic

ORDERS = [("eu", 250), ("us", 400), ("eu", 50), ("eu", 120), ("apac", 999)]


def main() -> int:
    args = arguments(__doc__.splitlines()[0], "OrdersByRegion")
    ensure_topic(args.nameserver, args.topic)
    run = uuid.uuid4().hex[:8]
    expected = set()
    with txmq.Producer(args.nameserver) as producer:
        for i, (region, amount) in enumerate(ORDERS):
            body = f"order {run} {i}".encode()
            producer.send(txmq.Message(args.topic, body, properties={"region": region, "amount": str(amount)}))
            if region == "eu" and amount > 100:
                expected.add(body)
    got = set()
    selector = txmq.SqlFilter("region = 'eu' AND amount > 100")
    with txmq.SimpleConsumer(args.nameserver, consumer_group=f"sql-example-{run}",
                             subscriptions={args.topic: selector}, await_duration_seconds=1.0) as consumer:
        deadline = time.monotonic() + 30
        while got != expected and time.monotonic() < deadline:
            for m in consumer.receive(16):
                consumer.ack(m)
                if m.body.startswith(f"order {run}".encode()):
                    got.add(m.body)
    print(f"matched: {sorted(b.decode() for b in got)}")
    return 0 if got == expected else 1


if __name__ == "__main__":
    sys.exit(main())
