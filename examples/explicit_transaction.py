"""An explicit transaction (Kafka's and RocketMQ 5's form): begin, send half messages, do
the local work, commit — and a checker that answers by the transaction's key.

    python examples/explicit_transaction.py --nameserver 127.0.0.1:9876

Each order's messages are sent inside ``with producer.begin_transaction(key=order)``; the
"database" records the key in the same local transaction. The block commits at its end and
rolls back when it raises (one order here fails on purpose). A consumer then sees exactly
the messages of the orders that committed. Exits 0 when it does.
"""

from __future__ import annotations

import sys
import threading
import uuid

import txmq
from _common import arguments, ensure_topic

LocalState = txmq.LocalTransactionState


class Orders:
    """Stands for the application's database: the keys of the orders committed."""

    def __init__(self) -> None:
        self.committed: set[str] = set()
        self.lock = threading.Lock()

    def check(self, message: txmq.TransactionMessage) -> LocalState:
        # A check reaches this instance (or another of the group, after a crash): the
        # record of the key decides.
        with self.lock:
            return LocalState.COMMIT if message.transaction_key in self.committed else LocalState.ROLLBACK


def main() -> int:
    args = arguments(__doc__.splitlines()[0], "OrdersExplicit")
    ensure_topic(args.nameserver, args.topic)
    orders = Orders()
    run = uuid.uuid4().hex[:8]
    expected = set()
    with txmq.TransactionProducer(args.nameserver, producer_group="explicit-example", checker=orders.check) as p:
        for i in range(args.count):
            order = f"order-{run}-{i}"
            try:
                with p.begin_transaction(key=order) as tx:
                    p.send(txmq.Message(args.topic, f"{order} created".encode()), tx)
                    p.send(txmq.Message(args.topic, f"{order} reserved".encode()), tx)
                    if i == 1:
                        raise ValueError("out of stock")  # the block raises: both messages roll back
                    with orders.lock:
                        orders.committed.add(order)  # the local transaction records the key
                expected |= {f"{order} created".encode(), f"{order} reserved".encode()}
                print(f"{order}: committed {[m.transaction_id for m in tx.messages]}")
            except ValueError as err:
                print(f"{order}: rolled back ({err})")

    got = set()
    with txmq.SimpleConsumer(args.nameserver, consumer_group=f"explicit-example-{run}",
                             subscriptions={args.topic: "*"}, await_duration_seconds=1.0) as consumer:
        for _ in range(30):
            for m in consumer.receive(32):
                if m.body.startswith(f"order-{run}".encode()):
                    got.add(m.body)
                consumer.ack(m)
            if got >= expected:
                break
    print(f"received {len(got)} of {len(expected)} committed messages")
    return 0 if got == expected else 1


if __name__ == "__main__":
    sys.exit(main())
