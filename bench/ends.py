"""What an EndTransaction costs the broker and the client as a unary call and as an entry on
the Produce stream, alternated in one run (the path an anchored transaction's end takes).

    python -m bench.ends [--transactions 300] [--rounds 3]

One asyncio producer, one transaction at a time (a caller alone): each transaction sends
its half message, then its COMMIT either way; each round runs both ways in turn, the order
swapped every round, and prints the broker's CPU and this process's CPU per transaction
(the scheduler's own accounting) and the rate. The half message is the same both ways, so
the difference is the end's. The machine is shared: compare the two columns of one round.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time

import psutil


async def _round(producer, topic: str, transactions: int, way: str,
                 broker: psutil.Process) -> tuple[float, float, float, float]:
    from txmq import Message
    from txmq.v1 import broker_pb2, common_pb2

    async def one(i: int) -> None:
        half = await producer._send_half(Message(topic, b"x" * 256))
        end = broker_pb2.EndTransactionRequest(
            transaction_id=half.transaction_id, message_id=half.message_id,
            resolution=common_pb2.TRANSACTION_RESOLUTION_COMMIT, source=common_pb2.TRANSACTION_SOURCE_CLIENT,
            producer_group=producer.producer_group)
        address = await producer._client.broker_address(half.broker_name)
        await producer._request(half.broker_name, address, broker_pb2.ProduceEntry(end_transaction=end),
                                stream=way == "stream")

    for i in range(20):  # warm both paths
        await one(i)
    b0, c0, t0 = broker.cpu_times(), time.process_time(), time.monotonic()
    for i in range(transactions):
        await one(i)
    b1, c1, t1 = broker.cpu_times(), time.process_time(), time.monotonic()
    per = 1e6 / transactions
    return ((b1.user + b1.system - b0.user - b0.system) * per, (b1.system - b0.system) * per, (c1 - c0) * per,
            transactions / (t1 - t0))


async def _main(args: argparse.Namespace, cluster) -> None:
    import txmq
    import txmq.aio

    topic = "ends"
    cluster.create_topic(topic, 1)
    broker = psutil.Process(cluster.brokers[0].pid)
    class Listener(txmq.aio.AsyncTransactionListener):  # every transaction here is committed
        async def execute_local_transaction(self, message, arg):
            return txmq.LocalTransactionState.COMMIT

        async def check_local_transaction(self, message):
            return txmq.LocalTransactionState.COMMIT

    async with txmq.aio.AsyncTransactionProducer(cluster.nameserver_address, producer_group="ends",
                                                 listener=Listener(), answer_checks=False) as producer:
        print(f"{'round':>5} {'end as':>8} {'broker µs/txn':>14} {'of it system':>13} {'client µs/txn':>14} "
              f"{'txn/s':>8}  load")
        for r in range(args.rounds):
            for way in (("unary", "stream") if r % 2 == 0 else ("stream", "unary")):
                broker_us, system_us, client_us, rate = await _round(producer, topic, args.transactions, way, broker)
                print(f"{r + 1:>5} {way:>8} {broker_us:>14,.0f} {system_us:>13,.0f} {client_us:>14,.0f} {rate:>8,.0f}  "
                      f"{psutil.getloadavg()[0]:.1f}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ends", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--transactions", type=int, default=300, help="transactions per way per round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    from tests.support.cluster import Cluster

    with tempfile.TemporaryDirectory(prefix="bench-ends-") as workdir:
        cluster = Cluster(workdir)
        try:
            asyncio.run(_main(args, cluster))
        finally:
            cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
