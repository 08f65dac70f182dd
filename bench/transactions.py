"""End-to-end transactional throughput and latency, with the comparison measured in the
same run.

    python -m bench.transactions [--seconds 10] [--producers 1,8] [--json FILE]

Starts a name server and a broker (``flush=sync``) as local processes, then for each
producer count runs producers that do half send → no-op local transaction → commit in a
loop while a consumer process receives and acknowledges. A transaction counts once it is
consumed and acknowledged; its latency runs from before the half send to the consume.
In the same run it measures the raw rate of an empty unary RPC (the stock health Check) on
the same broker server stack with the same number of concurrent callers, and prints
txn/s ÷ ping/s, which is what to compare across machines. Broker RSS (with its WAL sync
helper) is sampled at the end; broker CPU includes the helper's.

The producers are threads of one process sharing one ``TransactionProducer`` (a service
with 8 worker threads), so they share one Produce stream and its batching; the consumer
runs in a process of its own. ``--client-processes N`` spreads the producers (and the
ping callers) over N processes instead.

``--acks`` chooses how the consumer acknowledges: ``deferred`` (the default:
``ack_later``, the acks ride its next receive) or ``calls`` (``ack_many``, a call per
batch); ``--acks calls,deferred`` runs each producer count both ways in the same run and
prints the consumer's calls (ReceiveMessages + AckMessages, counted by the broker) per
transaction beside the CPU.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from typing import Any

from bench import machine

#: Each phase sends to a topic of its own, so its new consumer group starts with no backlog
#: of the phases before it.
TOPIC = "bench-orders-{producers}"


def _split(n: int, processes: int) -> list[int]:
    """n callers over at most ``processes`` processes."""
    procs = max(1, min(n, processes))
    return [n // procs + (1 if i < n % procs else 0) for i in range(procs)]


# --- worker processes -----------------------------------------------------------------------

def _run_threads(run: Any, threads: int, start: Any) -> float:
    """Runs ``run(i)`` on ``threads`` threads; returns this process's CPU seconds from the
    common start signal until they all end."""
    import threading

    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    start.wait()
    cpu = time.process_time()
    for w in workers:
        w.join()
    return time.process_time() - cpu


def _ping_worker(address: str, threads: int, start: Any, stop: Any, out: Any) -> None:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    channel = grpc.insecure_channel(address)
    stub = health_pb2_grpc.HealthStub(channel)
    stub.Check(health_pb2.HealthCheckRequest(), timeout=5)
    counts = [0] * threads

    def run(i: int) -> None:
        request = health_pb2.HealthCheckRequest()
        start.wait()
        while not stop.is_set():
            stub.Check(request, timeout=5)
            counts[i] += 1

    cpu = _run_threads(run, threads, start)
    out.put(("ping", sum(counts), cpu))


def _producer_worker(nameserver: str, topic: str, threads: int, start: Any, stop: Any, out: Any) -> None:
    import txmq

    class Commit(txmq.TransactionListener):
        def execute_local_transaction(self, message: Any, arg: Any) -> txmq.LocalTransactionState:
            return txmq.LocalTransactionState.COMMIT

        def check_local_transaction(self, message: Any) -> txmq.LocalTransactionState:
            return txmq.LocalTransactionState.COMMIT

    counts = [0] * threads
    errors = [0] * threads
    producer = txmq.TransactionProducer(nameserver, producer_group="bench-producers", listener=Commit())
    producer.send_in_transaction(txmq.Message(topic, b"warm-up %f" % time.time()))

    def run(i: int) -> None:
        start.wait()
        while not stop.is_set():
            body = b"%.6f" % time.time()
            try:
                result = producer.send_in_transaction(txmq.Message(topic, body))
                if result.state is txmq.TransactionState.COMMITTED:
                    counts[i] += 1
                else:
                    errors[i] += 1
            except txmq.TxmqError:
                errors[i] += 1

    cpu = _run_threads(run, threads, start)
    producer.close()
    out.put(("produced", sum(counts), sum(errors), cpu))


#: How the consumer acknowledges (``--acks``).
ACK_MODES = ("deferred", "calls")


def acknowledge(consumer: Any, batch: list[Any], acks: str) -> None:
    """Acknowledges a received batch: ``deferred`` queues the acks for the next receive
    (``ack_later``), ``calls`` sends them now (``ack_many``, one AckMessages)."""
    if acks == "deferred":
        for message in batch:
            consumer.ack_later(message)
    else:
        consumer.ack_many(batch)


def consumer_calls(metrics_port: int) -> float:
    """ReceiveMessages + AckMessages the broker has answered (the consumers' calls)."""
    import urllib.request

    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("txmq_rpc_duration_seconds_count{")
               and ('method="ReceiveMessages"' in line or 'method="AckMessages"' in line))


def _consumer_worker(nameserver: str, topic: str, group: str, start: Any, stop: Any, window: Any,
                     out: Any, acks: str = "calls") -> None:
    import txmq

    latencies: list[float] = []
    counted = 0
    errors = 0
    slowest = 0.0
    receives = 0
    with txmq.SimpleConsumer(nameserver, consumer_group=group, subscriptions={topic: "*"},
                             await_duration_seconds=0.5) as consumer:
        consumer.receive(max_messages=1, invisible_duration_seconds=1)  # creates the group
        start.wait()
        cpu = time.process_time()
        while not stop.is_set():
            began = time.monotonic()
            try:
                batch = consumer.receive(max_messages=128, invisible_duration_seconds=60)
                slowest = max(slowest, time.monotonic() - began)
                receives += 1
            except txmq.TxmqError as exc:  # a slow answer on a loaded machine: count it, go on
                if not exc.retryable:
                    raise
                errors += 1
                continue
            if not batch:
                continue
            acknowledge(consumer, batch, acks)
            now = time.time()
            begin, end = window[0], window[1]
            for m in batch:
                try:
                    born = float(m.body)
                except ValueError:
                    continue
                if begin <= born and (end == 0 or born <= end):
                    counted += 1
                    latencies.append(now - born)
    out.put(("consumed", counted, latencies, time.process_time() - cpu, errors, slowest, receives))


# --- orchestration --------------------------------------------------------------------------

def _cpu_with_children(process: Any) -> float:
    """User + system CPU seconds of a process and its live children (the broker's WAL
    sync helper)."""
    total = sum(process.cpu_times()[:2])
    for child in process.children():
        total += sum(child.cpu_times()[:2])
    return total


#: The broker's samples the benchmark reads before and after a phase, by the name it uses.
_BROKER_SAMPLES = {
    "in": 'txmq_produce_stream_messages_total{direction="in"}',
    "out": 'txmq_produce_stream_messages_total{direction="out"}',
    "entries": "txmq_produce_entries_total",
    "syncs": "txmq_store_wal_sync_seconds_count",
    "sync_seconds": "txmq_store_wal_sync_seconds_sum",
    "synced_writes": "txmq_store_wal_synced_writes_total",
}


def _produce_counts(metrics_port: int) -> dict[str, float]:
    """The broker's Produce stream and WAL sync counters."""
    import urllib.request

    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
    values = dict(line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
    return {name: float(values.get(sample, 0.0)) for name, sample in _BROKER_SAMPLES.items()}


def _run_phase(kind: str, target: str, callers: int, seconds: float, broker_pid: int, metrics_port: int,
               processes: int, topic: str = "", group: str = "",
               watch: dict[str, int] | None = None, acks: str = "calls") -> dict[str, Any]:
    """One timed phase. ``watch`` names more processes (a replicated shard's followers,
    etcd) whose CPU seconds over the timed window come back in ``results["cpu"]``."""
    import psutil

    broker = psutil.Process(broker_pid)
    watched = {name: psutil.Process(pid) for name, pid in (watch or {}).items()}
    produce_before = _produce_counts(metrics_port)
    ctx = mp.get_context("spawn")
    start, stop, stop_consumer = ctx.Event(), ctx.Event(), ctx.Event()
    out = ctx.Queue()
    window = ctx.Array("d", [0.0, 0.0])
    procs = []
    consumer = None
    if kind == "txn":
        consumer = ctx.Process(target=_consumer_worker, args=(target, topic, group, start, stop_consumer,
                                                                  window, out, acks))
        consumer.start()
    for threads in _split(callers, processes):
        if kind == "ping":
            p = ctx.Process(target=_ping_worker, args=(target, threads, start, stop, out))
        else:
            p = ctx.Process(target=_producer_worker, args=(target, topic, threads, start, stop, out))
        p.start()
        procs.append(p)
    time.sleep(2.0)  # let every worker connect and warm up before the clock starts
    window[0] = time.time()
    began = time.perf_counter()
    broker_cpu = _cpu_with_children(broker)
    watched_cpu = {name: _cpu_with_children(p) for name, p in watched.items()}
    machine = psutil.cpu_times()
    calls = consumer_calls(metrics_port)
    start.set()
    time.sleep(seconds)
    window[1] = time.time()
    stop.set()
    elapsed = time.perf_counter() - began
    machine_after = psutil.cpu_times()
    results: dict[str, Any] = {"produced": 0, "errors": 0, "ping": 0, "client_cpu": 0.0,
                               "broker_cpu": _cpu_with_children(broker) - broker_cpu,
                               "cpu": {name: _cpu_with_children(p) - watched_cpu[name] for name, p in watched.items()},
                               "machine_busy": _busy_fraction(machine, machine_after)}
    for _ in procs:
        item = out.get(timeout=60)
        if item[0] == "ping":
            results["ping"] += item[1]
            results["client_cpu"] += item[2]
        else:
            results["produced"] += item[1]
            results["errors"] += item[2]
            results["client_cpu"] += item[3]
    for p in procs:
        p.join(30)
    if consumer is not None:
        # Drain what was committed inside the window, then stop the consumer.
        time.sleep(1.5)
        stop_consumer.set()
        _, consumed, latencies, consumer_cpu, consumer_errors, slowest, receives = out.get(timeout=60)
        results["receives"] = receives
        results["errors"] += consumer_errors
        results["slowest_receive"] = slowest
        consumer.join(30)
        results["consumed"] = consumed
        results["consumer_cpu"] = consumer_cpu
        results["consumer_calls"] = consumer_calls(metrics_port) - calls
        results["latencies"] = latencies
    results["elapsed"] = elapsed
    results["produce"] = {k: v - produce_before[k] for k, v in _produce_counts(metrics_port).items()}
    return results


def _busy_fraction(before: Any, after: Any) -> float:
    """The share of the machine's CPU time (all cores) that was not idle between two
    ``psutil.cpu_times()`` samples."""
    idle = (after.idle + getattr(after, "iowait", 0.0)) - (before.idle + getattr(before, "iowait", 0.0))
    total = sum(after) - sum(before)
    return max(0.0, 1.0 - idle / total) if total > 0 else 0.0


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.transactions", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--producers", default="1,8")
    parser.add_argument("--json", default="")
    parser.add_argument("--acks", default="deferred",
                        help="how the consumer acknowledges, comma-separated to compare: deferred (ack_later), "
                             "calls (ack_many)")
    parser.add_argument("--client-processes", type=int, default=1,
                        help="processes the producers (and the ping callers) are spread over, threads inside")
    args = parser.parse_args(argv)
    counts = [int(x) for x in args.producers.split(",")]
    ack_modes = [x for x in args.acks.split(",") if x]
    if not ack_modes or any(m not in ACK_MODES for m in ack_modes):
        parser.error(f"--acks: comma-separated of {', '.join(ACK_MODES)}")

    from services.common.process import ServiceProcess

    workdir = tempfile.mkdtemp(prefix="txmq-bench-")
    nameserver = ServiceProcess("services.nameserver", {"TXMQ_AUTO_CREATE_TOPICS": "true"}, workdir, "nameserver")
    nameserver.start_and_wait(30)
    broker = ServiceProcess("services.broker", {
        "TXMQ_NAMESERVER_ADDRESSES": nameserver.address, "TXMQ_DATA_DIR": os.path.join(workdir, "broker-0"),
        "TXMQ_FLUSH": "sync", "TXMQ_TRANSACTION_TIMEOUT_SECONDS": "3600", "TXMQ_HEARTBEAT_INTERVAL_SECONDS": "1",
    }, workdir, "broker-0")
    broker.start_and_wait(30)
    rows = []
    try:
        import grpc

        from txmq.v1 import admin_pb2, admin_pb2_grpc
        admin = admin_pb2_grpc.AdminServiceStub(grpc.insecure_channel(nameserver.address))

        def create_topic(topic: str) -> None:
            deadline = time.monotonic() + 30
            while True:
                try:
                    admin.CreateTopic(admin_pb2.CreateTopicRequest(topic=topic, queue_count=8), timeout=5)
                    return
                except grpc.RpcError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)

        for n in counts:
            ping = _run_phase("ping", broker.address, n, args.seconds, broker.pid, broker.metrics_port,
                              args.client_processes)
            ping_rate = ping["ping"] / ping["elapsed"]
            for acks in ack_modes:
                topic = TOPIC.format(producers=n) + ("" if len(ack_modes) == 1 else f"-{acks}")
                create_topic(topic)
                txn = _run_phase("txn", nameserver.address, n, args.seconds, broker.pid, broker.metrics_port,
                                 args.client_processes, topic=topic, group=f"bench-consumers-{n}-{acks}", acks=acks)
                rows.append(_row(n, acks, txn, ping, ping_rate, broker.pid))
    finally:
        broker.stop(15)
        nameserver.stop(15)
    _print(rows, args)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=2)
    return 0


def _row(n: int, acks: str, txn: dict[str, Any], ping: dict[str, Any], ping_rate: float,
         broker_pid: int) -> dict[str, Any]:
    import psutil

    rate = txn["consumed"] / txn["elapsed"]
    lat = txn["latencies"]
    broker_process = psutil.Process(broker_pid)
    rss = sum(p.memory_info().rss for p in [broker_process, *broker_process.children()])
    return {
        "producers": n, "acks": acks, "txn_per_s": round(rate, 1), "ping_per_s": round(ping_rate, 1),
        "ratio": round(rate / ping_rate, 3) if ping_rate else None,
        "p50_ms": round(_percentile(lat, 0.50) * 1000, 2), "p99_ms": round(_percentile(lat, 0.99) * 1000, 2),
        "committed": txn["produced"], "consumed": txn["consumed"], "errors": txn["errors"],
        "broker_rss_mib": round(rss / 2**20, 1),
        "mean_ms": round(statistics.fmean(lat) * 1000, 2) if lat else None,
        "broker_cpu_us_per_txn": round(txn["broker_cpu"] / max(txn["consumed"], 1) * 1e6),
        "producer_cpu_us_per_txn": round(txn["client_cpu"] / max(txn["consumed"], 1) * 1e6),
        "consumer_cpu_us_per_txn": round(txn["consumer_cpu"] / max(txn["consumed"], 1) * 1e6),
        "broker_cpu_us_per_ping": round(ping["broker_cpu"] / max(ping["ping"], 1) * 1e6),
        "slowest_receive_ms": round(txn["slowest_receive"] * 1000, 1),
        "messages_per_receive": round(txn["consumed"] / max(txn["receives"], 1), 1),
        "entries_per_produce_in": round(txn["produce"]["entries"] / max(txn["produce"]["in"], 1), 2),
        "entries_per_produce_out": round(txn["produce"]["entries"] / max(txn["produce"]["out"], 1), 2),
        "wal_syncs_per_txn": round(txn["produce"]["syncs"] / max(txn["consumed"], 1), 2),
        "wal_sync_mean_ms": round(txn["produce"]["sync_seconds"] / max(txn["produce"]["syncs"], 1) * 1000, 3),
        "writes_per_wal_sync": round(txn["produce"]["synced_writes"] / max(txn["produce"]["syncs"], 1), 2),
        "consumer_calls_per_txn": round(txn["consumer_calls"] / max(txn["consumed"], 1), 3),
    }


def _print(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    print(f"\ntxmq end-to-end transactions (flush=sync, {args.seconds:.0f} s per phase, "
          f"{machine.describe()})")
    print(f"{'producers':>9} {'acks':>8} {'txn/s':>8} {'ping/s':>8} {'txn/ping':>8} {'p50 ms':>8} {'p99 ms':>8} "
          f"{'broker RSS MiB':>15}")
    for r in rows:
        print(f"{r['producers']:>9} {r['acks']:>8} {r['txn_per_s']:>8} {r['ping_per_s']:>8} {r['ratio']:>8} "
              f"{r['p50_ms']:>8} {r['p99_ms']:>8} {r['broker_rss_mib']:>15}")
    print("\nCPU per committed-and-consumed transaction (µs): broker / producers / consumer; "
          "broker CPU per ping; messages per consumer receive; entries per Produce message in / out; "
          "consumer calls (ReceiveMessages + AckMessages) per transaction")
    for r in rows:
        print(f"{r['producers']:>9} {r['acks']:>8} {r['broker_cpu_us_per_txn']:>8} {r['producer_cpu_us_per_txn']:>8} "
              f"{r['consumer_cpu_us_per_txn']:>8} {r['broker_cpu_us_per_ping']:>8} {r['messages_per_receive']:>8} "
              f"{r['entries_per_produce_in']:>6} {r['entries_per_produce_out']:>6} {r['consumer_calls_per_txn']:>6}")
    print("\nWAL syncs per transaction; mean sync wait (ms); writes per sync (group commit)")
    for r in rows:
        print(f"{r['producers']:>9} {r['acks']:>8} {r['wal_syncs_per_txn']:>8} {r['wal_sync_mean_ms']:>8} "
              f"{r['writes_per_wal_sync']:>8}")


if __name__ == "__main__":
    sys.exit(main())
