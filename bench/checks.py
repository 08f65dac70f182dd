"""Checks at scale: check lag, checks/s, RocksDB bytes written per check and broker RSS,
with a large backlog of pending transactions of which a steady stream becomes due.

    python -m bench.checks [--pending 100000] [--due 10000] [--window 10] [--json FILE]

For each scenario the broker's store is seeded **directly** through
``services.broker.core.BrokerCore`` before the broker starts (the same operations the
broker applies for a half send, in group commits without fsync; 100k half messages take
seconds this way instead of minutes over gRPC): ``pending - due`` transactions whose first
check is an hour away (the backlog, which must cost nothing) and ``due`` transactions whose
first checks fall evenly over ``window`` seconds starting shortly after the services are up
(the steady stream). Then a name server, the broker (``flush=sync``) and one checker start
as processes, and a producer process of the group answers every check UNKNOWN — a pure
check: the claim, the DELIVERED report and the UNKNOWN answer each update only the small
transaction row and the due index (``check_interval_seconds`` is an hour, so each
transaction is checked once in the window).

Measured per scenario:
- check lag: listener call time − the due time written into the message (same machine, so
  the same clock): p50/p99; the checker's own ``txmq_check_lag_seconds`` (due → acknowledged)
  is printed beside it as its histogram bucket bounds;
- checks/s over the window;
- bytes written per check: the delta of the broker's ``txmq_store_written_bytes_total``
  during the window ÷ the checks answered in it;
- broker RSS at the end.

Scenarios: 100 B bodies with the full backlog; 64 KiB bodies with a small backlog (a 64 KiB
backlog of 100k would be 6.4 GB of disk for a number that does not depend on it); and, for
the "RSS does not grow with the pending count" target, 100 B with a tenth of the backlog.
RocketMQ rewrites the whole half message on every check, so its bytes per check are about
the message size; the table prints that comparison.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing as mp
import os
import re
import shutil
import tempfile
import time
import urllib.request
from typing import Any

TOPIC = "bench-checks"
GROUP = "bench-checkers"
#: Seconds between the end of seeding and the first due check (services start meanwhile).
START_DELAY_SECONDS = 8.0


# --- seeding -----------------------------------------------------------------------------------

def seed(data_dir: str, pending: int, due: int, body_size: int, window: float) -> float:
    """Writes ``pending`` half messages straight into a broker store; returns the epoch time
    at which the first of the ``due`` ones becomes due."""
    from services.broker.config import BrokerConfig
    from services.broker.core import BrokerCore
    from services.broker.store import codec
    from services.broker.store.codec import LogRecord

    core = BrokerCore(BrokerConfig(broker_name="broker-0", data_dir=data_dir, flush="async"))
    try:
        core.db.call(core.create_topic_op(TOPIC, 8))
        body = os.urandom(body_size)
        backlog = pending - due
        # The due stream starts after seeding (estimated generously) plus the start delay.
        estimate = pending * (0.0002 + body_size / 200e6)
        first_due = time.time() + estimate + START_DELAY_SECONDS
        for i in range(pending):
            if i < backlog:
                immunity, due_ms = 3600.0, 0
            else:
                target = first_due + (i - backlog) * window / max(due, 1)
                immunity, due_ms = max(target - time.time(), 0.001), int(target * 1000)
            record = core.validate_message(LogRecord(
                kind=codec.KIND_HALF, topic=TOPIC, body=body, message_id="", queue_id=i % 8, stored_ms=0,
                producer_group=GROUP, producer_client_id="bench-seeder", check_immunity_seconds=immunity,
                properties={"due_ms": str(due_ms)}))
            core.db.apply(core.send_op(record), sync=False)
        if time.time() > first_due - 3:
            raise RuntimeError("seeding took longer than estimated: raise START_DELAY_SECONDS")
        return first_due
    finally:
        core.close()


# --- the answering producer ----------------------------------------------------------------------

def _answer(nameserver: str, ready: Any, stop: Any, out: Any) -> None:
    import threading

    import txmq

    lags: list[float] = []
    lock = threading.Lock()

    class Listener(txmq.TransactionListener):
        def execute_local_transaction(self, message, arg):  # pragma: no cover - never sends
            return txmq.LocalTransactionState.UNKNOWN

        def check_local_transaction(self, message):
            now = time.time()
            due_ms = int(message.properties.get("due_ms", "0"))
            if due_ms:
                with lock:
                    lags.append(now - due_ms / 1000)
            return txmq.LocalTransactionState.UNKNOWN

    producer = txmq.TransactionProducer(nameserver, producer_group=GROUP, listener=Listener(),
                                        check_threads=4, checker_refresh_seconds=1.0)
    while not producer.connected_checkers():
        time.sleep(0.05)
    ready.set()
    stop.wait()
    producer.close()
    out.put(lags)


# --- measuring -----------------------------------------------------------------------------------

def scrape(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    values: dict[str, float] = {}
    for line in text.splitlines():
        m = re.match(r"^([a-zA-Z_:]+(?:\{[^}]*\})?) (\S+)$", line)
        if m:
            values[m.group(1)] = float(m.group(2))
    return values


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


def histogram_quantile(values: dict[str, float], name: str, q: float) -> str:
    """The bucket bound under which ``q`` of the observations fall (Prometheus style)."""
    buckets = sorted(((float(m.group(1)) if m.group(1) != "+Inf" else float("inf")), v)
                     for k, v in values.items() if (m := re.match(name + r'_bucket\{.*le="([^"]+)".*\}', k)))
    total = buckets[-1][1] if buckets else 0
    for bound, count in buckets:
        if total and count >= q * total:
            return f"≤{bound:g}s"
    return "n/a"


@dataclasses.dataclass
class Scenario:
    name: str
    pending: int
    due: int
    body_size: int


def run(scenario: Scenario, window: float) -> dict[str, Any]:
    import psutil

    from services.common.process import ServiceProcess

    workdir = tempfile.mkdtemp(prefix="txmq-bench-checks-")
    data_dir = os.path.join(workdir, "broker-0")
    started = time.time()
    first_due = seed(data_dir, scenario.pending, scenario.due, scenario.body_size, window)
    seed_seconds = time.time() - started
    procs: list[Any] = []
    ctx = mp.get_context("spawn")
    stop, ready, out = ctx.Event(), ctx.Event(), ctx.Queue()
    answerer = None
    try:
        nameserver = ServiceProcess("services.nameserver", {}, workdir, "nameserver")
        procs.append(nameserver)
        nameserver.start_and_wait(30)
        broker = ServiceProcess("services.broker", {
            "TXMQ_NAMESERVER_ADDRESSES": nameserver.address, "TXMQ_DATA_DIR": data_dir, "TXMQ_FLUSH": "sync",
            "TXMQ_BROKER_NAME": "broker-0", "TXMQ_HEARTBEAT_INTERVAL_SECONDS": "1",
            "TXMQ_CHECK_INTERVAL_SECONDS": "3600", "TXMQ_CHECK_INTERVAL_MAX_SECONDS": "3600",
        }, workdir, "broker-0")
        procs.append(broker)
        broker.start_and_wait(60)
        checker = ServiceProcess("services.checker", {
            "TXMQ_NAMESERVER_ADDRESSES": nameserver.address, "TXMQ_CHECKER_NAME": "checker-0",
            "TXMQ_HEARTBEAT_INTERVAL_SECONDS": "1", "TXMQ_BROKER_REFRESH_SECONDS": "1",
            "TXMQ_CLAIM_INTERVAL_SECONDS": "0.05",
        }, workdir, "checker-0")
        procs.append(checker)
        checker.start_and_wait(30)
        deadline = time.time() + 30
        while True:  # the checker lists brokers every second and registers on start
            from txmq.v1 import nameserver_pb2, nameserver_pb2_grpc
            import grpc
            with grpc.insecure_channel(nameserver.address) as channel:
                stub = nameserver_pb2_grpc.NameServerServiceStub(channel)
                if stub.ListCheckers(nameserver_pb2.ListCheckersRequest(), timeout=5).checkers:
                    break
            if time.time() > deadline:
                raise RuntimeError("checker not registered")
            time.sleep(0.1)
        answerer = ctx.Process(target=_answer, args=(nameserver.address, ready, stop, out))
        answerer.start()
        if not ready.wait(30):
            raise RuntimeError("the answering producer did not subscribe")
        if time.time() > first_due - 0.5:
            raise RuntimeError("services started after the first check was due: raise START_DELAY_SECONDS")
        while time.time() < first_due - 0.5:
            time.sleep(0.05)
        before = scrape(broker.metrics_port)
        t0 = time.time()
        end = first_due + window
        # Wait for the stream to be checked: until the end of the window plus up to 30 s.
        answered_key = f'txmq_checks_total{{group="{GROUP}",result="unknown"}}'
        while True:
            time.sleep(0.25)
            cmetrics = scrape(checker.metrics_port)
            if cmetrics.get(answered_key, 0) >= scenario.due or time.time() > end + 30:
                break
        t1 = time.time()
        after = scrape(broker.metrics_port)
        rss = psutil.Process(broker.pid).memory_info().rss
        stop.set()
        lags = out.get(timeout=30)
        answerer.join(10)
        checks = int(cmetrics.get(answered_key, 0))
        written = after.get("txmq_store_written_bytes_total", 0) - before.get("txmq_store_written_bytes_total", 0)
        return {
            "scenario": scenario.name, "pending": scenario.pending, "due": scenario.due,
            "body_bytes": scenario.body_size, "seed_seconds": round(seed_seconds, 1),
            "checks": checks, "lost": scenario.due - checks,
            "checks_per_s": round(checks / max(min(t1, end + 1) - max(t0, first_due), 1e-9), 1),
            "offered_per_s": round(scenario.due / window, 1),
            "lag_p50_ms": round(percentile(lags, 0.50) * 1000, 1),
            "lag_p99_ms": round(percentile(lags, 0.99) * 1000, 1),
            "lag_max_ms": round(max(lags, default=float("nan")) * 1000, 1),
            "checker_lag_p99": histogram_quantile(cmetrics, "txmq_check_lag_seconds", 0.99),
            "bytes_per_check": round(written / max(checks, 1)),
            "broker_rss_mib": round(rss / 2**20, 1),
        }
    finally:
        stop.set()
        if answerer is not None and answerer.is_alive():
            answerer.join(5)
            if answerer.is_alive():
                answerer.kill()
        for proc in reversed(procs):
            proc.stop(15)
        shutil.rmtree(workdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.checks", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pending", type=int, default=100_000, help="transactions pending in the big backlog")
    parser.add_argument("--due", type=int, default=10_000,
                        help="of which become due during the window (the same rate in both 100 B scenarios)")
    parser.add_argument("--window", type=float, default=10.0, help="seconds over which they become due")
    parser.add_argument("--large-pending", type=int, default=2_000, help="64 KiB scenario: pending (all due)")
    parser.add_argument("--json", default="")
    args = parser.parse_args(argv)
    small_due = min(args.due, args.pending // 10) or 1  # same offered rate when pending ≥ 10 × due
    scenarios = [
        Scenario("100 B, backlog", args.pending, args.due, 100),
        Scenario("100 B, backlog / 10", max(args.pending // 10, small_due), small_due, 100),
        Scenario("64 KiB", args.large_pending, args.large_pending, 64 * 1024),
    ]
    rows = []
    for scenario in scenarios:
        print(f"running {scenario.name}: {scenario.pending} pending, {scenario.due} due over "
              f"{args.window:g} s, {scenario.body_size} B bodies ...", flush=True)
        rows.append(run(scenario, args.window))
        print("  " + json.dumps(rows[-1]), flush=True)
    print(f"\ntxmq checks (flush=sync, one checker, {os.cpu_count()} CPUs; lag = due → the "
          "producer's listener)")
    head = (f"{'scenario':<20} {'pending':>8} {'checks':>7} {'lost':>5} {'checks/s':>9} {'p50 ms':>7} "
            f"{'p99 ms':>7} {'B/check':>8} {'RocketMQ B/check*':>18} {'RSS MiB':>8}")
    print(head)
    for r in rows:
        print(f"{r['scenario']:<20} {r['pending']:>8} {r['checks']:>7} {r['lost']:>5} {r['checks_per_s']:>9} "
              f"{r['lag_p50_ms']:>7} {r['lag_p99_ms']:>7} {r['bytes_per_check']:>8} "
              f"{'≥' + str(r['body_bytes']):>18} {r['broker_rss_mib']:>8}")
    print("* RocketMQ rewrites the half message (body + properties) into the half topic on every check.")
    big, small, large = rows
    print(f"\ntargets: p99 check lag ≤ 1000 ms at {big['pending']} pending: {big['lag_p99_ms']} ms "
          f"({'met' if big['lag_p99_ms'] <= 1000 else 'MISSED'}); bytes per check 100 B vs 64 KiB: "
          f"{big['bytes_per_check']} vs {large['bytes_per_check']} "
          f"({'independent of size' if large['bytes_per_check'] < 2 * max(big['bytes_per_check'], 1) else 'DEPENDS on size'}); "
          f"broker RSS {small['pending']} vs {big['pending']} pending: {small['broker_rss_mib']} vs "
          f"{big['broker_rss_mib']} MiB")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
