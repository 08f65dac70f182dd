"""A multi-message transaction: several messages, on several topics (and shards), become
visible together at the commit, or none does.

    python examples/multi_message.py --nameserver 127.0.0.1:9876

Each transfer debits one account and credits another, as two messages on two topics of one
transaction; one transfer's local transaction fails (it raises: UNKNOWN, then the check
answers ROLLBACK). Exits 0 when exactly the committed transfers' messages arrived, both halves
of each.
"""

from __future__ import annotations

import sys
import threading
import time
import uuid

import txmq
from _common import arguments, ensure_topic

LocalState = txmq.LocalTransactionState


class Transfers(txmq.TransactionListener):
    def __init__(self) -> None:
        self.done: set[str] = set()
        self.lock = threading.Lock()

    def execute_local_transaction(self, message: txmq.TransactionMessage, arg: str) -> LocalState:
        if arg.endswith("-1"):
            raise RuntimeError("insufficient funds")  # UNKNOWN; result.local_error says why
        with self.lock:
            self.done.add(message.transaction_id)  # the global transaction's id
        return LocalState.COMMIT

    def check_local_transaction(self, message: txmq.TransactionMessage) -> LocalState:
        with self.lock:
            return LocalState.COMMIT if message.transaction_id in self.done else LocalState.ROLLBACK


def main() -> int:
    args = arguments(__doc__.splitlines()[0], "Debits")
    debits, credits = args.topic, f"{args.topic}-credits"
    ensure_topic(args.nameserver, debits)
    ensure_topic(args.nameserver, credits)
    run = uuid.uuid4().hex[:8]
    expected = set()
    with txmq.TransactionProducer(args.nameserver, producer_group="transfers-example", listener=Transfers()) as p:
        for i in range(args.count):
            transfer = f"transfer-{run}-{i}"
            result = p.send_in_transaction([txmq.Message(debits, f"{transfer} debit".encode()),
                                            txmq.Message(credits, f"{transfer} credit".encode())], arg=transfer)
            state = result.state.name if result.state else "not ended"
            print(f"{transfer}: {state}" + (f" (the local transaction raised {result.local_error!r})"
                                             if result.local_error else ""))
            if result.state is txmq.TransactionState.COMMITTED:
                expected |= {f"{transfer} debit".encode(), f"{transfer} credit".encode()}
    got = set()
    with txmq.SimpleConsumer(args.nameserver, consumer_group=f"transfers-example-{run}",
                             subscriptions={debits: "*", credits: "*"}, await_duration_seconds=1.0) as consumer:
        deadline = time.monotonic() + 30
        while got != expected and time.monotonic() < deadline:
            for m in consumer.receive(32):
                consumer.ack(m)
                if m.body.startswith(f"transfer-{run}".encode()):
                    got.add(m.body)
    print(f"received {len(got)} of {len(expected)} messages of committed transfers")
    return 0 if got == expected and len(expected) == 2 * (args.count - 1) else 1


if __name__ == "__main__":
    sys.exit(main())
