"""FIFO: the messages of one message group are delivered in the order sent, one at a time
(the next only once the previous is acknowledged), while different groups run in parallel.

    python examples/fifo.py --nameserver 127.0.0.1:9876

Sends the steps of a few orders (one message group per order) to a FIFO topic, and a push
consumer with several threads records what it sees. Exits 0 when every order's steps
arrived in order.
"""

from __future__ import annotations

import sys
import threading
import time
import uuid

import txmq
from _common import arguments, ensure_topic

STEPS = ("created", "paid", "shipped")


def main() -> int:
    args = arguments(__doc__.splitlines()[0], "OrderStepsFifo")
    ensure_topic(args.nameserver, args.topic, fifo=True)  # `txmq topic create T --fifo`
    run = uuid.uuid4().hex[:8]
    orders = [f"order-{run}-{i}" for i in range(args.count)]
    with txmq.Producer(args.nameserver) as producer:
        for step in STEPS:
            for order in orders:
                producer.send(txmq.Message(args.topic, f"{order} {step}".encode(), message_group=order))

    seen: dict[str, list[str]] = {order: [] for order in orders}
    lock = threading.Lock()
    done = threading.Event()

    def listener(message: txmq.ReceivedMessage) -> txmq.ConsumeResult:
        order, step = message.body.decode().split()
        if order in seen:
            with lock:
                seen[order].append(step)
                if all(len(s) == len(STEPS) for s in seen.values()):
                    done.set()
        return txmq.ConsumeResult.SUCCESS

    with txmq.PushConsumer(args.nameserver, consumer_group=f"fifo-example-{run}", subscriptions={args.topic: "*"},
                           listener=listener, consume_threads=4, await_duration_seconds=1.0):
        done.wait(30)
        time.sleep(0.2)  # anything delivered twice or late would show here
    for order in orders:
        print(order, " -> ".join(seen[order]))
    return 0 if all(tuple(s) == STEPS for s in seen.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
