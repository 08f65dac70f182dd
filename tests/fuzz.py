"""``make fuzz``: every RPC of every service fuzzed with at least ``--calls`` requests
(default 10,000), then the status census per RPC, whether every service still serves, and
fsck of the broker's store; then the replication port of a replicated shard (three
replicas, etcd) with ``--replication`` connections at its leader and at a follower
(default 2,000 each; 0 skips it, ``tests/support/replfuzz.py``), its replicas compared and
fsck'ed afterwards. Exit status 1 when a call answered INTERNAL, UNKNOWN or CANCELLED, a
service stopped serving, fsck found a problem or the replication fuzz failed.

    python -m tests.fuzz [--calls 10000] [--only BrokerService/QueryTransactions] [--replication 2000]
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time

from tests.conftest import TEST_BROKER_ENV
from tests.support.cluster import Cluster
from tests.support import replfuzz
from tests.support.fuzz import Census, Fuzzer, cluster_targets, fsck, seed, serving


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=10_000, help="requests per RPC (default 10,000)")
    parser.add_argument("--only", action="append", default=[], help="fuzz only this Service/Method (repeatable)")
    parser.add_argument("--replication", type=int, default=2000,
                        help="connections to a replicated shard's leader and follower replication ports (0: skip)")
    args = parser.parse_args(argv)
    # SIGTERM stops the cluster too (the finally blocks run).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    census = Census()
    with tempfile.TemporaryDirectory(prefix="txmq-fuzz-") as workdir:
        cluster = Cluster(workdir, broker_env=TEST_BROKER_ENV, checker=True, proxies=1)
        try:
            print("seeds:", seed(cluster), flush=True)
            fuzzer = Fuzzer(cluster_targets(cluster), census)
            started = time.monotonic()
            try:
                for rpc, method, address in fuzzer.methods():
                    if args.only and rpc not in args.only:
                        continue
                    t = time.monotonic()
                    fuzzer.run(rpc, method, address, args.calls)
                    print(f"{rpc}: {census.calls(rpc)} calls in {time.monotonic() - t:.1f} s "
                          f"{dict(census.counts[rpc])}", flush=True)
            finally:
                fuzzer.close()
            elapsed = time.monotonic() - started
            health = serving(cluster)
            cluster.stop_broker(0)
            code, report = fsck(str(cluster.brokers[0].env["TXMQ_DATA_DIR"]))
        finally:
            cluster.stop()
    total = sum(census.calls(r) for r in census.counts)
    print()
    print(census.table())
    print(f"\n{total} calls over {len(census.counts)} RPCs in {elapsed:.0f} s; "
          f"{sum(census.failures.values())} answered INTERNAL/UNKNOWN/CANCELLED")
    for failure, n in census.failures.most_common():
        print(f"  {n} x {failure}")
    print("serving afterwards:", health)
    print(f"fsck of the broker's store: exit {code}\n{report.strip()}")
    ok = not census.failures and all(v == "SERVING" for v in health.values()) and code == 0
    if args.replication > 0 and not args.only:
        ok = replication(args.replication) and ok
    return 0 if ok else 1


def replication(examples: int) -> bool:
    """The replication port of a three-replica shard; True when the property held."""
    census = replfuzz.Census()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="txmq-fuzz-replication-") as workdir:
        with Cluster(workdir, broker_env=TEST_BROKER_ENV, replication_factor=3) as cluster:
            try:
                report = replfuzz.run_on_cluster(cluster, examples, census)
            except AssertionError as exc:  # replicas unequal or fsck problems (stop_and_compare)
                report = {"errors": [f"after the fuzz: {exc}"], "running": {}, "still_leader": False}
    print(f"\nreplication port of a replicated shard, {examples} connections per port, "
          f"{time.monotonic() - started:.0f} s:\n{census.table()}")
    for failure, n in census.failures.most_common():
        print(f"  {n} x {failure}")
    print("errors logged:", report["errors"] or "none", "| replicas running:", report["running"],
          "| leader kept:", report["still_leader"], "| replicas equal and fsck clean:", not report["errors"])
    return not census.failures and not report["errors"] and all(report["running"].values()) \
        and report["still_leader"]


if __name__ == "__main__":
    sys.exit(main())
