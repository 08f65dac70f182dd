"""RocketMQ's TransactionProducer example, for txmq.

The listener runs a pretend local transaction whose outcome cycles through UNKNOWN, COMMIT
and ROLLBACK (value % 3) and records it by transaction id; ``check_local_transaction``
answers the checker from that record, as RocketMQ's TransactionListenerImpl does.

    python examples/transaction_producer.py --nameserver 127.0.0.1:9876

Exits 0 when every transaction ended in the state its local transaction decided.
"""

from __future__ import annotations

import itertools
import sys
import threading

import txmq
from _common import arguments, ensure_topic

LocalState = txmq.LocalTransactionState


class TransactionListenerImpl(txmq.TransactionListener):
    def __init__(self) -> None:
        self._index = itertools.count()
        self._lock = threading.Lock()
        self._local_transactions: dict[str, int] = {}

    def execute_local_transaction(self, message: txmq.TransactionMessage, arg: object) -> LocalState:
        status = next(self._index) % 3
        with self._lock:
            self._local_transactions[message.transaction_id] = status
        return (LocalState.UNKNOWN, LocalState.COMMIT, LocalState.ROLLBACK)[status]

    def check_local_transaction(self, message: txmq.TransactionMessage) -> LocalState:
        # Called by the checker for transactions still undecided (UNKNOWN above).
        with self._lock:
            status = self._local_transactions.get(message.transaction_id)
        if status == 0:
            return LocalState.UNKNOWN
        if status == 2:
            return LocalState.ROLLBACK
        return LocalState.COMMIT


EXPECTED = {
    LocalState.COMMIT: txmq.TransactionState.COMMITTED,
    LocalState.ROLLBACK: txmq.TransactionState.ROLLED_BACK,
    LocalState.UNKNOWN: txmq.TransactionState.PREPARED,
}


def main() -> int:
    args = arguments(__doc__.splitlines()[0], "TopicTest1234")
    ensure_topic(args.nameserver, args.topic)
    tags = ["TagA", "TagB", "TagC", "TagD", "TagE"]
    ok = True
    with txmq.TransactionProducer(args.nameserver, producer_group="please_rename_unique_group_name",
                                  listener=TransactionListenerImpl()) as producer:
        for i in range(args.count):
            message = txmq.Message(args.topic, f"Hello txmq {i}".encode(), tag=tags[i % len(tags)],
                                   keys=(f"KEY{i}",))
            result = producer.send_in_transaction(message)
            state = result.state.name if result.state else f"unresolved ({result.end_error})"
            print(f"{i}: message {result.message_id} transaction {result.transaction_id} "
                  f"local {result.local_state.name} -> {state}")
            ok &= result.state is EXPECTED[result.local_state]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
