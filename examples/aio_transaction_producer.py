"""Transactions from asyncio: ``AsyncTransactionProducer`` with a listener whose methods are
coroutines; many transactions run concurrently on one connection per broker.

    python examples/aio_transaction_producer.py --nameserver 127.0.0.1:9876

The local transactions commit, except every third, which raises: its result carries the
exception (``result.local_error``), its state stays PREPARED, and the check (answered by
``check_local_transaction``) rolls it back. Exits 0 when the committed ones arrived and
the others never did.
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid

import txmq
from _common import arguments, ensure_topic
from txmq.aio import AsyncSimpleConsumer, AsyncTransactionListener, AsyncTransactionProducer

LocalState = txmq.LocalTransactionState


class Payments(AsyncTransactionListener):
    def __init__(self) -> None:
        self.paid: set[str] = set()

    async def execute_local_transaction(self, message: txmq.TransactionMessage, arg: int) -> LocalState:
        await asyncio.sleep(0.01)  # the database call
        if arg % 3 == 2:
            raise RuntimeError("card declined")
        self.paid.add(message.transaction_id)
        return LocalState.COMMIT

    async def check_local_transaction(self, message: txmq.TransactionMessage) -> LocalState:
        return LocalState.COMMIT if message.transaction_id in self.paid else LocalState.ROLLBACK


async def main() -> int:
    args = arguments(__doc__.splitlines()[0], "PaymentsAsync")
    ensure_topic(args.nameserver, args.topic)
    run = uuid.uuid4().hex[:8]
    async with AsyncTransactionProducer(args.nameserver, producer_group="aio-payments-example",
                                        listener=Payments()) as producer:
        results = await asyncio.gather(*(producer.send_in_transaction(
            txmq.Message(args.topic, f"payment {run} {i}".encode()), arg=i) for i in range(args.count)))
    for r in results:
        print(f"{r.transaction_id}: {r.state.name if r.state else 'not ended'}"
              + (f" ({r.local_error!r})" if r.local_error else ""))
    failed_right = all(isinstance(r.local_error, RuntimeError) and r.state is txmq.TransactionState.PREPARED
                       for i, r in enumerate(results) if i % 3 == 2)
    expected = {f"payment {run} {i}".encode() for i in range(args.count) if i % 3 != 2}
    got: set[bytes] = set()
    async with AsyncSimpleConsumer(args.nameserver, consumer_group=f"aio-payments-{run}",
                                   subscriptions={args.topic: "*"}, await_duration_seconds=1.0) as consumer:
        deadline = time.monotonic() + 30
        while got != expected and time.monotonic() < deadline:
            for m in await consumer.receive(32):
                await consumer.ack(m)
                if m.body.startswith(f"payment {run}".encode()):
                    got.add(m.body)
    print(f"received {len(got)} of {len(expected)} committed payments")
    return 0 if got == expected and failed_right else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
