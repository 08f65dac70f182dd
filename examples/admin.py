"""The Admin API: create a topic, send and consume a little, then look at the consumer
group's position and lag, the transactions of a producer group, and the brokers.

    python examples/admin.py --nameserver 127.0.0.1:9876

What ``txmq topic|group|txn|broker ...`` prints, from code. Exits 0 when the group's lag
is back to 0 after consuming and the undecided transaction is listed, then resolved.
"""

from __future__ import annotations

import sys
import time
import uuid

import txmq
from _common import arguments, state_name


class Undecided(txmq.TransactionListener):
    def execute_local_transaction(self, message, arg):
        return txmq.LocalTransactionState.UNKNOWN  # left to the check (or to an operator)

    def check_local_transaction(self, message):
        return txmq.LocalTransactionState.UNKNOWN


def main() -> int:
    args = arguments(__doc__.splitlines()[0], "AdminExample")
    run = uuid.uuid4().hex[:8]
    topic, group, producers = f"{args.topic}-{run}", f"admin-example-{run}", f"admin-example-pg-{run}"
    with txmq.Admin(args.nameserver) as admin:
        admin.create_topic(topic, queue_count=2)
        print("brokers:", [b.name for b in admin.list_brokers().brokers])
        with txmq.Producer(args.nameserver) as producer:
            for i in range(args.count):
                producer.send(txmq.Message(topic, b"%d" % i))
        with txmq.SimpleConsumer(args.nameserver, consumer_group=group, subscriptions={topic: "*"},
                                 await_duration_seconds=1.0) as consumer:
            received = 0
            deadline = time.monotonic() + 30
            while received < args.count and time.monotonic() < deadline:
                batch = consumer.receive(16)
                consumer.ack_many(batch)
                received += len(batch)
        lag = sum(q.lag_messages for q in admin.consumer_groups(group).queues)
        print(f"group {group}: received {received}, lag {lag}")

        with txmq.TransactionProducer(args.nameserver, producer_group=producers, listener=Undecided(),
                                      answer_checks=False) as producer:
            pending = producer.send_in_transaction(txmq.Message(topic, b"undecided"))
        listed = [t for t in admin.list_transactions(producer_group=producers).transactions
                  if state_name(t) == "PREPARED"]
        print("pending:", [t.transaction_id for t in listed])
        admin.resolve_transaction(pending.transaction_id, "rollback", operator="admin-example",
                                  reason="an example of an operator's decision")
        state = state_name(admin.describe_transaction(pending.transaction_id).transaction)
        print("after resolve:", state)
        admin.delete_topic(topic, force=True)
    ok = (received == args.count and lag == 0 and [t.transaction_id for t in listed] == [pending.transaction_id]
          and state == "ROLLED_BACK")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
