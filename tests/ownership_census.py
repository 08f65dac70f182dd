"""The ownership census (issue 30), printed: every RPC that takes an id, tried by a principal
allowed on resource A with ids of resource B (captured and forged), natively and through the
RocketMQ proxy, on a real cluster with auth on; malformed ids on every RPC taking a receipt
handle; etcd with certificates and users that are not a broker's; the default chart rendered
and checked. Prints every attempt, the totals, and what B's resources look like afterwards.

    python -m tests.ownership_census [--no-proxy] [--no-etcd] [--no-chart]

Exit status 1 when an unauthorized attempt succeeded, a malformed one was answered
INTERNAL/UNKNOWN (or 50000/50001), or B's resources changed. The chart's findings are
printed but do not set the status while its secure defaults are not merged (--strict-chart
makes them count).
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
from pathlib import Path

from tests.support.ownership import Census, chart_defaults, etcd_census, run_cluster_census, secured_cluster


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--no-proxy", action="store_true", help="skip the RocketMQ-protocol side")
    parser.add_argument("--no-etcd", action="store_true", help="skip etcd")
    parser.add_argument("--no-chart", action="store_true", help="skip the chart's defaults")
    parser.add_argument("--strict-chart", action="store_true", help="the chart's findings set the exit status")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    census = Census()
    started = time.monotonic()
    changed: list[str] = []
    problems: list[str] = []
    chart: list[str] = []
    with tempfile.TemporaryDirectory(prefix="txmq-ownership-") as workdir:
        cluster = secured_cluster(Path(workdir) / "cluster")
        try:
            changed = run_cluster_census(cluster, census, proxy=not args.no_proxy)
        finally:
            cluster.stop()
        if not args.no_etcd:
            problems = etcd_census(Path(workdir) / "etcd", census)
    if not args.no_chart:
        from tests.chart.chart import helm_binary
        chart = chart_defaults(helm_binary())
    print(census.table())
    print(f"\n{time.monotonic() - started:.0f} s")
    print("B's resources afterwards:", changed if changed else "unchanged")
    if not args.no_etcd:
        print("etcd controls (the brokers' own access):", problems if problems else "ok")
    if not args.no_chart:
        print("default chart:", "auth, TLS, NetworkPolicy and etcd auth on" if not chart else "")
        for finding in chart:
            print(f"  open: {finding}")
    ok = not census.successes and not changed and not problems and (not args.strict_chart or not chart)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
