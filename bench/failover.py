"""Producers while one shard fails (issue 21): transactions committed per second before,
during and after the failure of one of two shards, measured in the same run, for RF=1 and
for RF=3 (replicated shards on etcd).

    python -m bench.failover [--seconds 8] [--threads 4] [--local-ms 0] [--rf 1,3] [--json FILE]

Starts a name server, two shards (``flush=sync``) and a checker as local processes, a
topic with queues on both, and ``--threads`` threads of one ``TransactionProducer``
committing in a loop (each local transaction takes ``--local-ms``). After ``--seconds``:

- RF=1: SIGKILLs broker-1, restarts it ``--seconds`` later, and measures as long again;
- RF=3 (three replicas per shard, min in-sync 2, 1 s leader lease as in the tests):
  SIGKILLs broker-1's leader (a follower takes over) and measures ``--seconds`` from the
  kill, then ``--seconds`` more.

Prints the transactions committed in each second, the rate of each phase with during ÷
before, the calls that failed to the application, the sends rerouted, the other shard's
sends per second before and during, and how long broker-1 took to receive sends again.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from typing import Any


def sent_again_within(producer: Any, since: float, until: float) -> float | None:
    """Seconds from ``since`` until broker-1 answered 10 more sends, or None by ``until``."""
    from tests.support.failover import shard_successes

    served = shard_successes(producer, "broker-1")
    while time.monotonic() < until:
        if shard_successes(producer, "broker-1") > served + 10:
            return time.monotonic() - since
        time.sleep(0.01)
    return None


def run(rf: int, args: argparse.Namespace) -> dict[str, Any]:
    import txmq
    from tests.support.cluster import Cluster
    from tests.support.failover import CommitListener, CommitLoad, Window, shard_successes

    cluster = Cluster(tempfile.mkdtemp(prefix=f"txmq-bench-failover-rf{rf}-"), brokers=2, checker=True,
                      replication_factor=rf,
                      broker_env={"TXMQ_FLUSH": "sync", "TXMQ_TRANSACTION_TIMEOUT_SECONDS": "1.0",
                                  "TXMQ_CHECK_INTERVAL_SECONDS": "0.5"})
    try:
        if rf > 1:
            cluster.wait_leaders()
        topic = "bench-failover"
        cluster.create_topic(topic, 8)
        listener = CommitListener(args.local_ms / 1000)
        with txmq.TransactionProducer(cluster.nameserver_address, producer_group="bench-failover",
                                      listener=listener) as producer:
            load = CommitLoad(producer, topic, threads=args.threads).start()
            try:
                load.window(50, 60)  # connections open, routes cached
                t0 = time.monotonic()
                other0 = shard_successes(producer, "broker-0")
                time.sleep(args.seconds)
                t1 = time.monotonic()
                other1 = shard_successes(producer, "broker-0")
                if rf == 1:
                    cluster.kill_broker(1)
                else:
                    leader = cluster.leader("broker-1")
                    assert leader is not None, "broker-1 has no leader"
                    leader.kill()
                # RF=3: broker-1 takes sends again (from its new leader) within this phase.
                back_after = sent_again_within(producer, t1, t1 + args.seconds) if rf > 1 else None
                time.sleep(max(0.0, t1 + args.seconds - time.monotonic()))
                t2 = time.monotonic()
                other2 = shard_successes(producer, "broker-0")
                if rf == 1:
                    cluster.restart_broker(1)
                    t3 = time.monotonic()
                    back_after = sent_again_within(producer, t3, t3 + 30)
                else:
                    t3 = t2
                time.sleep(max(0.0, args.seconds - (time.monotonic() - t3)))
                t4 = time.monotonic()
            finally:
                load.stop()
            stats = producer.routing_stats()
    finally:
        cluster.stop()

    phases = {"before": (t0, t1), "during": (t1, t2), "after": (t3, t4)}
    windows = {name: Window(load.count_between(a, b), b - a) for name, (a, b) in phases.items()}
    return {
        "rf": rf, "windows": windows,
        "per_second": {name: load.per_second(a, b) for name, (a, b) in phases.items()},
        "ratio": windows["during"].rate / windows["before"].rate if windows["before"].rate else 0.0,
        "other_shard_per_second": ((other1 - other0) / (t1 - t0), (other2 - other1) / (t2 - t1)),
        "failed_calls": len(load.errors), "left_to_check": len(load.end_errors), "rerouted": stats.rerouted,
        "back_after_seconds": back_after, "restart_seconds": t3 - t2,
    }


def report(r: dict[str, Any], args: argparse.Namespace) -> None:
    rf = r["rf"]
    what = ("broker-1 SIGKILLed, restarted after" if rf == 1
            else "broker-1's leader SIGKILLed (a follower takes over), measured")
    print(f"\nRF={rf}: {what} {args.seconds:g} s; {args.threads} threads of one TransactionProducer, "
          f"local transaction {args.local_ms:g} ms")
    print(f"{'':>8} {'txn/s':>8}   transactions committed in each second")
    for name, w in r["windows"].items():
        print(f"{name:>8} {w.rate:>8.1f}   {' '.join(str(n) for n in r['per_second'][name])}")
    before, during = r["other_shard_per_second"]
    seconds = r["back_after_seconds"]
    back = "broker-1 got no sends again" if seconds is None else (
        f"broker-1 sent to again {seconds:.2f} s after it registered (restart took {r['restart_seconds']:.2f} s)"
        if rf == 1 else f"broker-1 sent to again {seconds:.2f} s after its leader was killed")
    print(f"during / before = {r['ratio']:.2f}; calls failed to the application: {r['failed_calls']}; "
          f"EndTransactions left to the check: {r['left_to_check']}; sends rerouted: {r['rerouted']}; "
          f"broker-0 sends/s before {before:.1f}, during {during:.1f}; {back}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.failover", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=8.0, help="length of each phase")
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--local-ms", type=float, default=0.0, help="time each local transaction takes")
    parser.add_argument("--rf", default="1,3", help="replication factors to run, comma-separated (1 and/or 3)")
    parser.add_argument("--json", default="")
    args = parser.parse_args(argv)
    factors = [int(f) for f in args.rf.split(",") if f.strip()]
    if not factors or any(f not in (1, 3) for f in factors):
        parser.error(f"--rf takes 1 and/or 3, got {args.rf!r}")

    results = []
    for rf in factors:
        results.append(run(rf, args))
        report(results[-1], args)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump([{"rf": r["rf"], "rates": {k: round(w.rate, 1) for k, w in r["windows"].items()},
                        "per_second": r["per_second"], "ratio": round(r["ratio"], 3),
                        "other_shard_per_second": [round(x, 1) for x in r["other_shard_per_second"]],
                        "failed_calls": r["failed_calls"], "rerouted": r["rerouted"],
                        "back_after_seconds": None if r["back_after_seconds"] is None
                        else round(r["back_after_seconds"], 2)} for r in results], fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
