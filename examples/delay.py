"""Delayed delivery: a message sent with ``delay_seconds`` is stored at once and delivered
only once its delay has passed (``delivery_time`` gives the moment instead).

    python examples/delay.py --nameserver 127.0.0.1:9876 --delay 2

Exits 0 when no delayed message arrived before its time and every one arrived.
"""

from __future__ import annotations

import sys
import time
import uuid

import txmq
from _common import arguments, ensure_topic


def main() -> int:
    args = arguments(__doc__.splitlines()[0], "Reminders",
                     lambda p: p.add_argument("--delay", type=float, default=2.0, help="seconds"))
    ensure_topic(args.nameserver, args.topic)
    run = uuid.uuid4().hex[:8]
    with txmq.Producer(args.nameserver) as producer:
        sent_at = time.time()
        for i in range(args.count):
            producer.send(txmq.Message(args.topic, f"reminder {run} {i}".encode(), delay_seconds=args.delay))
    early, arrived = [], {}
    with txmq.SimpleConsumer(args.nameserver, consumer_group=f"delay-example-{run}",
                             subscriptions={args.topic: "*"}, await_duration_seconds=1.0) as consumer:
        deadline = time.monotonic() + args.delay + 30
        while len(arrived) < args.count and time.monotonic() < deadline:
            for m in consumer.receive(16):
                consumer.ack(m)
                if not m.body.startswith(f"reminder {run}".encode()):
                    continue
                waited = time.time() - sent_at
                arrived[m.body] = waited
                if waited < args.delay - 0.05:  # clocks of one machine: a small margin
                    early.append(m.body)
    for body, waited in sorted(arrived.items()):
        print(f"{body.decode()}: after {waited:.2f} s")
    return 0 if len(arrived) == args.count and not early else 1


if __name__ == "__main__":
    sys.exit(main())
