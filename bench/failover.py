"""Producers while one shard fails (issue 21): transactions committed per second before,
during and after a SIGKILL of one of two brokers, measured in the same run.

    python -m bench.failover [--seconds 8] [--threads 4] [--local-ms 0] [--json FILE]

Starts a name server, two brokers (RF=1, ``flush=sync``) and a checker as local
processes, a topic with queues on both, and ``--threads`` threads of one
``TransactionProducer`` committing in a loop (each local transaction takes ``--local-ms``).
After ``--seconds`` it SIGKILLs broker-1, restarts it ``--seconds`` later, and measures as
long again. Prints the transactions committed in each second, the rate of each phase with
during ÷ before, the calls that failed to the application, the sends rerouted and how long
the restarted broker took to receive sends again. (RF=3 comes with replication.)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.failover", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=8.0, help="length of each phase")
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--local-ms", type=float, default=0.0, help="time each local transaction takes")
    parser.add_argument("--json", default="")
    args = parser.parse_args(argv)

    import txmq
    from tests.support.cluster import Cluster
    from tests.support.failover import CommitListener, CommitLoad, Window, shard_successes

    cluster = Cluster(tempfile.mkdtemp(prefix="txmq-bench-failover-"), brokers=2, checker=True,
                      broker_env={"TXMQ_FLUSH": "sync", "TXMQ_TRANSACTION_TIMEOUT_SECONDS": "1.0",
                                  "TXMQ_CHECK_INTERVAL_SECONDS": "0.5"})
    try:
        topic = "bench-failover"
        cluster.create_topic(topic, 8)
        listener = CommitListener(args.local_ms / 1000)
        with txmq.TransactionProducer(cluster.nameserver_address, producer_group="bench-failover",
                                      listener=listener) as producer:
            load = CommitLoad(producer, topic, threads=args.threads).start()
            try:
                load.window(50, 60)  # connections open, routes cached
                t0 = time.monotonic()
                time.sleep(args.seconds)
                t1 = time.monotonic()
                cluster.kill_broker(1)
                time.sleep(args.seconds)
                t2 = time.monotonic()
                cluster.restart_broker(1)
                t3 = time.monotonic()
                served = shard_successes(producer, "broker-1")
                while shard_successes(producer, "broker-1") <= served and time.monotonic() < t3 + 30:
                    time.sleep(0.01)
                back_after = time.monotonic() - t3
                time.sleep(max(0.0, args.seconds - back_after))
                t4 = time.monotonic()
            finally:
                load.stop()
            stats = producer.routing_stats()
    finally:
        cluster.stop()

    phases = {"before": (t0, t1), "during": (t1, t2), "after": (t3, t4)}
    windows = {name: Window(load.count_between(a, b), b - a) for name, (a, b) in phases.items()}
    per_second = {name: load.per_second(a, b) for name, (a, b) in phases.items()}
    ratio = windows["during"].rate / windows["before"].rate if windows["before"].rate else 0.0
    print(f"\ntxmq producers while one of two shards fails (RF=1, {args.threads} threads of one "
          f"TransactionProducer, local transaction {args.local_ms:g} ms, {args.seconds:g} s per phase)")
    print(f"{'':>8} {'txn/s':>8}   transactions committed in each second")
    for name, w in windows.items():
        print(f"{name:>8} {w.rate:>8.1f}   {' '.join(str(n) for n in per_second[name])}")
    print(f"during / before = {ratio:.2f}; calls failed to the application: {len(load.errors)}; "
          f"EndTransactions left to the check: {len(load.end_errors)}; sends rerouted: {stats.rerouted}; "
          f"broker-1 sent to again {back_after:.2f} s after it registered (restart took {t3 - t2:.2f} s)")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"rates": {k: round(w.rate, 1) for k, w in windows.items()}, "per_second": per_second,
                       "ratio": round(ratio, 3), "failed_calls": len(load.errors), "rerouted": stats.rerouted,
                       "back_after_seconds": round(back_after, 2)}, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
