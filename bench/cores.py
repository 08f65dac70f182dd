"""A node's cores: throughput of the same job with 1 and with N broker shards (broker
processes) on one machine, measured in one run.

    python -m bench.cores [--seconds 6] [--shards 1,2] [--producers 16] [--client-processes 2]

A broker is one Python process with one event loop: it uses one core at the most (its
RocksDB writes and WAL syncs release the GIL, its gRPC and Python work do not). A node's
cores are used by running several shards on it, one broker process per core (the chart's
``broker.coresPerShard``, README "Performance"). For each shard count this starts a name
server and that many brokers (``flush=sync``), creates a topic of 8 queues (spread over the
shards by the name server), and runs ``bench.transactions``' job (half send → no-op local
transaction → commit → consumed and acknowledged) with ``--producers`` threads over
``--client-processes`` processes, and one consumer process. It prints txn/s, the brokers'
CPU per transaction, how busy the machine's CPUs were, and the ratio to one shard.

On a machine with fewer cores than brokers + clients need, the ratio shows the cost of
sharing them (the clients run here too); on a node of its own each shard gets a core.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Any

from bench.transactions import _percentile, _run_phase


def _create_topic(nameserver: str, topic: str, queues: int) -> None:
    import grpc

    from txmq.v1 import admin_pb2, admin_pb2_grpc

    admin = admin_pb2_grpc.AdminServiceStub(grpc.insecure_channel(nameserver))
    deadline = time.monotonic() + 30
    while True:
        try:
            admin.CreateTopic(admin_pb2.CreateTopicRequest(topic=topic, queue_count=queues), timeout=5)
            return
        except grpc.RpcError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def run_shards(shards: int, seconds: float, producers: int, processes: int) -> dict[str, Any]:
    """One phase with ``shards`` brokers."""
    from services.common.process import ServiceProcess

    workdir = tempfile.mkdtemp(prefix=f"txmq-bench-cores-{shards}-")
    nameserver = ServiceProcess("services.nameserver", {}, workdir, "nameserver")
    nameserver.start_and_wait(30)
    brokers = []
    try:
        for i in range(shards):
            broker = ServiceProcess("services.broker", {
                "TXMQ_NAMESERVER_ADDRESSES": nameserver.address,
                "TXMQ_DATA_DIR": os.path.join(workdir, f"broker-{i}"), "TXMQ_BROKER_NAME": f"broker-{i}",
                "TXMQ_FLUSH": "sync", "TXMQ_TRANSACTION_TIMEOUT_SECONDS": "3600",
                "TXMQ_HEARTBEAT_INTERVAL_SECONDS": "1",
            }, workdir, f"broker-{i}")
            broker.start_and_wait(30)
            brokers.append(broker)
        topic = "bench-cores"
        _create_topic(nameserver.address, topic, 8)
        first = brokers[0]
        txn = _run_phase("txn", nameserver.address, producers, seconds, first.pid, first.metrics_port, processes,
                         topic=topic, group="bench-cores", watch={b.name: b.pid for b in brokers[1:]})
    finally:
        for broker in brokers:
            broker.stop(15)
        nameserver.stop(15)
    consumed = max(txn["consumed"], 1)
    brokers_cpu = txn["broker_cpu"] + sum(txn["cpu"].values())
    return {"shards": shards, "txn_per_s": round(txn["consumed"] / txn["elapsed"], 1),
            "p50_ms": round(_percentile(txn["latencies"], 0.5) * 1000, 2),
            "brokers_cpu_us_per_txn": round(brokers_cpu / consumed * 1e6),
            "brokers_cores_busy": round(brokers_cpu / txn["elapsed"], 2),
            "clients_cpu_us_per_txn": round((txn["client_cpu"] + txn["consumer_cpu"]) / consumed * 1e6),
            "machine_busy": round(txn["machine_busy"], 2), "committed": txn["produced"],
            "consumed": txn["consumed"], "errors": txn["errors"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cores", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--shards", default="1,2", help="broker counts, comma-separated")
    parser.add_argument("--producers", type=int, default=16)
    parser.add_argument("--client-processes", type=int, default=2)
    parser.add_argument("--json", default="")
    args = parser.parse_args(argv)
    rows = [run_shards(int(n), args.seconds, args.producers, args.client_processes)
            for n in args.shards.split(",")]
    base = rows[0]["txn_per_s"] or 1.0
    print(f"\nShards on one machine ({os.cpu_count()} CPUs): {args.producers} producers over "
          f"{args.client_processes} processes, flush=sync, {args.seconds:g} s each")
    print(f"{'shards':>6} {'txn/s':>8} {'÷ first':>8} {'p50 ms':>7} {'brokers µs/txn':>15} "
          f"{'brokers cores':>14} {'clients µs/txn':>15} {'machine busy':>13}")
    for r in rows:
        print(f"{r['shards']:>6} {r['txn_per_s']:>8} {r['txn_per_s'] / base:>8.2f} {r['p50_ms']:>7} "
              f"{r['brokers_cpu_us_per_txn']:>15} {r['brokers_cores_busy']:>14} "
              f"{r['clients_cpu_us_per_txn']:>15} {r['machine_busy']:>13}")
    bad = [r for r in rows if r["consumed"] < r["committed"] * 0.99 or r["errors"]]
    for r in bad:
        print(f"shards={r['shards']}: committed {r['committed']}, consumed {r['consumed']}, "
              f"errors {r['errors']}", file=sys.stderr)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
