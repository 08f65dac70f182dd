"""``make fuzz``: every RPC of every service fuzzed with at least ``--calls`` requests
(default 10,000), then the status census per RPC, whether every service still serves, and
fsck of the broker's store. Exit status 1 when a call answered INTERNAL, UNKNOWN or
CANCELLED, a service stopped serving or fsck found a problem.

    python -m tests.fuzz [--calls 10000] [--only BrokerService/QueryTransactions]
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time

from tests.conftest import TEST_BROKER_ENV
from tests.support.cluster import Cluster
from tests.support.fuzz import Census, Fuzzer, cluster_targets, fsck, seed, serving


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=10_000, help="requests per RPC (default 10,000)")
    parser.add_argument("--only", action="append", default=[], help="fuzz only this Service/Method (repeatable)")
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
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
