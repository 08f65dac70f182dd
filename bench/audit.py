"""The audit pipeline at scale: audit rows/s on ``local[1]`` and ``local[2]`` in the same
run (and the speed-up), and the connector's read throughput in messages/s.

    python -m bench.audit [--transactions 1000000] [--brokers 2] [--queues 8] [--json FILE]

The transactions are generated **straight into the stores** of stopped brokers through
``services.broker.core.BrokerCore`` (the rows a committed or rolled-back transaction
leaves: its half record in the log, its transaction row and, when committed, its consume
queue entry), in large unsynced write batches — a million take about a minute this way,
hours when sent one by one. 90 % are committed (half by the client, half by a check), 10 %
rolled back; bodies are 64 bytes. Then a name server and the brokers start as processes
and the audit job (``txmq_pipeline.audit.run``) reads every transaction and every message
through the ``txmq`` data source, once per Spark master. The Spark session is restarted
between masters (one JVM at a time). Throughput is bounded by the brokers' Python gRPC
servers as much as by Spark: a broker serves ReadQueue/QueryTransactions on one core.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from services.broker.config import BrokerConfig
from services.broker.core import BrokerCore
from services.broker.store import codec
from tests.support.cluster import Cluster
from txmq.ids import MessageId

TOPIC = "bench-audit"
GROUPS = ("orders", "payments", "shipping")
BATCH = 5000


def generate(data_dir: str, broker: str, count: int, queues: int) -> float:
    """Writes ``count`` decided transactions into a stopped broker's store; returns seconds."""
    started = time.monotonic()
    core = BrokerCore(BrokerConfig(data_dir=data_dir, broker_name=broker, flush="async"))
    try:
        core.db.call(core.create_topic_op(TOPIC, queues))
        now = core.clock() - 3_600_000
        body = b"b" * 64
        done = 0
        while done < count:
            n = min(BATCH, count - done)
            first = done

            def op(w, first=first, n=n):
                for i in range(first, first + n):
                    seq = core.next_seq
                    q = i % queues
                    unique = hashlib.blake2b(f"{broker}/{i}".encode(), digest_size=16).digest()
                    mid = MessageId(broker, q, unique).encode()
                    group = GROUPS[i % len(GROUPS)]
                    prepared = now + i // 10
                    committed = i % 10 != 0
                    by_check = i % 20 == 1
                    record = codec.LogRecord(kind=codec.KIND_HALF, topic=TOPIC, body=body, message_id=mid,
                                             queue_id=q, stored_ms=prepared, tag="bench", keys=(f"k{i}",),
                                             producer_group=group, producer_client_id="bench", born_ms=prepared)
                    ended = prepared + (1500 + i % 500 if by_check else 2 + i % 40)
                    row = codec.TxnRow(seq=seq, state=codec.STATE_COMMITTED if committed else codec.STATE_ROLLED_BACK,
                                       producer_group=group, producer_client_id="bench", topic=TOPIC, queue_id=q,
                                       message_id=mid, prepared_ms=prepared, next_due_ms=0, body_size=len(body),
                                       source=codec.SOURCE_CHECK if by_check else codec.SOURCE_CLIENT,
                                       ended_ms=ended, checks_delivered=1 if by_check else 0,
                                       checks_answered=1 if by_check else 0)
                    w.put("log", codec.log_key(seq), codec.encode_log_record(record))
                    if committed:
                        offset = core.queue_next[(TOPIC, q)]
                        row.queue_offset = offset
                        w.put("cq", codec.cq_key(TOPIC, q, offset), codec.encode_cq_entry(codec.CqEntry(seq, ended, "bench")))
                        core.queue_next[(TOPIC, q)] = offset + 1
                    w.put("txn", codec.txn_key(seq), codec.encode_txn(row))
                    core.next_seq = seq + 1

            core.db.call(op, sync=False)
            done += n
        core.db.call(lambda w: None, sync=True)
    finally:
        core.close()
    return time.monotonic() - started


def spark_session(master: str):
    from txmq_pipeline.session import session

    spark = session(f"bench-audit-{master}", master, {
        "spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "8", "spark.driver.memory": "2g"})
    spark.sparkContext.setLogLevel("ERROR")
    return spark


class CpuMeter:
    """CPU seconds (user + system) of the brokers and of everything else this process
    started (the driver, Spark's JVM, its Python workers), between two readings."""

    def __init__(self, broker_pids: list[int]) -> None:
        import psutil

        self.psutil = psutil
        self.brokers = set(broker_pids)

    def _read(self) -> tuple[float, float]:
        me = self.psutil.Process()
        brokers = spark = 0.0
        for p in [me, *me.children(recursive=True)]:
            try:
                t = p.cpu_times()
            except self.psutil.NoSuchProcess:
                continue
            if p.pid in self.brokers:
                brokers += t.user + t.system
            elif p.name().startswith(("java", "python")) and p.pid not in self.brokers:
                spark += t.user + t.system
        return brokers, spark

    def __enter__(self) -> "CpuMeter":
        self.start = self._read()
        self.started = time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        end = self._read()
        self.seconds = time.monotonic() - self.started
        self.broker_cpu = end[0] - self.start[0]
        self.spark_cpu = end[1] - self.start[1]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--transactions", type=int, default=1_000_000)
    p.add_argument("--brokers", type=int, default=2)
    p.add_argument("--queues", type=int, default=8, help="queues of the topic per broker")
    p.add_argument("--masters", default="local[1],local[2]")
    p.add_argument("--repeat", type=int, default=1,
                   help="run the masters in turn this many times and compare the fastest run of each (the "
                        "machine's load varies: one run each can be off by 2x either way)")
    p.add_argument("--json", default=None, help="also write the results here")
    args = p.parse_args(argv)
    from txmq_pipeline import audit

    workdir = Path(tempfile.mkdtemp(prefix="bench-audit-"))
    results: dict[str, object] = {"transactions": args.transactions, "brokers": args.brokers, "queues": args.queues}
    try:
        per_broker = args.transactions // args.brokers
        gen = 0.0
        for b in range(args.brokers):
            count = per_broker + (args.transactions % args.brokers if b == 0 else 0)
            gen += generate(str(workdir / f"broker-{b}"), f"broker-{b}", count, args.queues)
        results["generate_seconds"] = round(gen, 1)
        print(f"generated {args.transactions:,} transactions into {args.brokers} stopped stores in {gen:.1f} s",
              flush=True)
        with Cluster(workdir, brokers=args.brokers,
                     broker_env={"TXMQ_FLUSH": "async", "TXMQ_RETENTION_INTERVAL_SECONDS": "3600"}) as cluster:
            cluster.wait_route(TOPIC, args.queues * args.brokers, timeout=60)
            audits = {}
            broker_pids = [b.pid for b in cluster.brokers]
            masters = args.masters.split(",")
            for round_, master in [(i, m) for i in range(args.repeat) for m in masters]:
                load = round(os.getloadavg()[0], 2)
                spark = spark_session(master)
                try:
                    with CpuMeter(broker_pids) as cpu:
                        r = audit.run(spark, nameserver=cluster.nameserver_address, output=str(workdir / ("out-" + master.replace("[", "").replace("]", "").replace("*", "all"))),
                                      topics=TOPIC, partitions_per_broker=8, max_messages_per_partition=100_000,
                                      pending_threshold_seconds=86400)
                    assert r.transactions == args.transactions, r.transactions
                    assert r.anomalies == 0, r.anomaly_counts
                    rate = r.transactions / r.seconds
                    busy = (cpu.broker_cpu + cpu.spark_cpu) / cpu.seconds
                    runs = audits.setdefault(master, {"runs": []})["runs"]
                    runs.append({"seconds": round(r.seconds, 1), "rows_per_second": round(rate),
                                 "phases_seconds": r.phases, "broker_cpu_seconds": round(cpu.broker_cpu, 1),
                                 "spark_cpu_seconds": round(cpu.spark_cpu, 1), "cores_busy": round(busy, 2),
                                 "machine_cores": os.cpu_count(), "load_before": load})
                    print(f"audit {master}: {r.transactions:,} transactions + {r.messages:,} messages in "
                          f"{r.seconds:.1f} s = {rate:,.0f} transactions/s; phases {r.phases}; CPU: brokers "
                          f"{cpu.broker_cpu:.1f} s, Spark (driver+JVM+workers) {cpu.spark_cpu:.1f} s = {busy:.2f} "
                          f"of {os.cpu_count()} cores busy (load average before: {load})", flush=True)
                    best = min(runs, key=lambda x: x["seconds"])
                    audits[master].update({"seconds": best["seconds"], "rows_per_second": best["rows_per_second"]})
                    if master == masters[-1] and round_ == args.repeat - 1:
                        df = (spark.read.format("txmq").option("nameserver", cluster.nameserver_address)
                              .option("topic", TOPIC).option("maxMessagesPerPartition", "100000").load())
                        started = time.monotonic()
                        n, size = df.selectExpr("count(*)", "sum(length(body))").collect()[0]
                        seconds = time.monotonic() - started
                        results["read"] = {"master": master, "messages": n, "body_bytes": size,
                                           "seconds": round(seconds, 1), "messages_per_second": round(n / seconds)}
                        print(f"connector read {master}: {n:,} messages in {seconds:.1f} s = "
                              f"{n / seconds:,.0f} messages/s", flush=True)
                finally:
                    spark.stop()
            results["audit"] = audits
            if len(masters) >= 2:
                speedup = audits[masters[0]]["seconds"] / audits[masters[-1]]["seconds"]
                results["speedup"] = round(speedup, 2)
                print(f"speed-up {masters[-1]} vs {masters[0]}: {speedup:.2f}x", flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(results, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
