"""Multi-message transactions: what a global transaction of N messages over two shards
costs against N one-message transactions and against one global transaction on one shard,
in the same run.

    python -m bench.global_transactions [--messages 4] [--seconds 10] [--json FILE]

A name server and two brokers (``flush=sync``) start as processes; one sync
``TransactionProducer`` on one thread runs, for ``--seconds`` each, back to back:

- *single*: ``send_in_transaction(message)`` ``messages`` times (the baseline: N transactions);
- *global, 2 shards*: ``send_in_transaction([m1..mN])`` on a topic with queues on both shards;
- *global, 1 shard*: the same on a topic whose queues are all on one shard.

Printed per mode: messages committed per second, transactions per second, mean latency of
one call, and each global mode's message rate as a ratio of the single mode's.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from typing import Any


def run(messages: int, seconds: float) -> dict[str, Any]:
    import txmq
    from services.common.process import ServiceProcess

    workdir = tempfile.mkdtemp(prefix="txmq-bench-global-")
    procs: list[Any] = []
    try:
        nameserver = ServiceProcess("services.nameserver", {}, workdir, "nameserver")
        procs.append(nameserver)
        nameserver.start_and_wait()
        for i in range(2):
            broker = ServiceProcess("services.broker", {
                "TXMQ_BROKER_NAME": f"broker-{i}", "TXMQ_DATA_DIR": f"{workdir}/broker-{i}",
                "TXMQ_NAMESERVER_ADDRESSES": nameserver.address, "TXMQ_HEARTBEAT_INTERVAL_SECONDS": "0.5"},
                workdir, f"broker-{i}")
            procs.append(broker)
            broker.start_and_wait()
        with txmq.Admin(nameserver.address) as admin:
            deadline = time.monotonic() + 30
            while len(admin.list_brokers(include_followers=False).brokers) < 2:
                if time.monotonic() > deadline:
                    raise RuntimeError("brokers did not register")
                time.sleep(0.1)
            admin.create_topic("bench-global-two", queue_count=4)
            admin.create_topic("bench-global-one", queue_count=1)

        class Commit(txmq.TransactionListener):
            def execute_local_transaction(self, message: Any, arg: Any) -> txmq.LocalTransactionState:
                return txmq.LocalTransactionState.COMMIT

            def check_local_transaction(self, message: Any) -> txmq.LocalTransactionState:
                return txmq.LocalTransactionState.COMMIT

        results: dict[str, Any] = {}
        with txmq.TransactionProducer(nameserver.address, producer_group="bench-global", listener=Commit()) as p:
            def batch(topic: str) -> list[Any]:
                return [txmq.Message(topic, b"x" * 100) for _ in range(messages)]

            modes = {
                "single": lambda: [p.send_in_transaction(m) for m in batch("bench-global-two")],
                "global, 2 shards": lambda: [p.send_in_transaction(batch("bench-global-two"))],
                "global, 1 shard": lambda: [p.send_in_transaction(batch("bench-global-one"))],
            }
            for call in modes.values():  # warm-up: routes (the topics reach the routes with a heartbeat), streams
                deadline = time.monotonic() + 30
                while True:
                    try:
                        call()
                        break
                    except txmq.TxmqError:
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(0.2)
            for name, call in modes.items():
                calls, committed = 0, 0
                started = time.monotonic()
                while time.monotonic() - started < seconds:
                    for r in call():
                        committed += messages if isinstance(r, txmq.GlobalTransactionResult) else 1
                    calls += 1
                took = time.monotonic() - started
                results[name] = {"messages_per_second": committed / took, "calls": calls,
                                 "mean_call_ms": took / calls * 1000,
                                 "transactions_per_second": calls * (1 if name != "single" else messages) / took}
        base = results["single"]["messages_per_second"]
        for r in results.values():
            r["ratio_to_single"] = r["messages_per_second"] / base
        return {"messages_per_transaction": messages, "seconds_per_mode": seconds, "modes": results}
    finally:
        for proc in reversed(procs):
            proc.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    out = run(args.messages, args.seconds)
    print(f"global transactions of {args.messages} messages, one producer thread, flush=sync")
    print(f"{'mode':<18} {'msg/s':>8} {'txn/s':>8} {'ms/call':>8} {'vs single':>9}")
    for name, r in out["modes"].items():
        print(f"{name:<18} {r['messages_per_second']:8.0f} {r['transactions_per_second']:8.0f} "
              f"{r['mean_call_ms']:8.2f} {r['ratio_to_single']:8.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
