"""Delay / timer messages at scale: how precisely and how fast the broker's timer moves
scheduled messages into their queues, with a small and with a large (1M) schedule, in the
same run.

    python -m bench.delay [--scheduled 1000000] [--due 50000] [--window 20] [--json FILE]

Two stores are seeded **directly** through ``services.broker.core.BrokerCore`` before the
broker starts (the same send operation the broker applies, in write groups without fsync:
1M sends over gRPC would take many minutes):

- *small*: ``due`` messages due evenly over ``window`` seconds, nothing else scheduled;
- *large*: ``scheduled`` messages in all: ``due`` due evenly over ``window`` seconds, then
  ``due`` due at one instant 5 s after the window (a burst: the timer's throughput), and
  the rest an hour ahead (a backlog the timer must not pay for).

Then a name server and the broker (``flush=sync``) start as processes and the timer runs.
Once every due message is in its queue, the broker stops and its store is read: each moved
message's queue entry carries the time it became visible, its log record the time it was
due. Printed: lateness (visible − due) p50/p99/max of the steady streams, small and large,
and their ratio; the burst's throughput (messages moved ÷ the time from the burst's due time
to the last one visible); none early (a message visible before its time is counted and
printed, and must be 0).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from typing import Any

TOPIC = "bench-delay"
#: Seconds between the end of seeding and the first due time (the services start meanwhile).
START_DELAY_SECONDS = 20.0
BURST_AFTER_SECONDS = 5.0


def seed(data_dir: str, steady: int, burst: int, backlog: int, window: float) -> tuple[float, float]:
    """Writes the schedule straight into a broker store; returns (first due, burst due) in
    epoch seconds (burst due 0 when there is no burst)."""
    from services.broker.config import BrokerConfig
    from services.broker.core import BrokerCore
    from services.broker.store import codec
    from services.broker.store.codec import LogRecord

    core = BrokerCore(BrokerConfig(broker_name="broker-0", data_dir=data_dir, flush="async"))
    try:
        core.db.call(core.create_topic_op(TOPIC, 8))
        total = steady + burst + backlog
        estimate = total * 0.0003
        first_due = time.time() + estimate + START_DELAY_SECONDS
        burst_due = first_due + window + BURST_AFTER_SECONDS if burst else 0.0
        body = os.urandom(100)
        i = 0
        while i < total:
            with core.db.grouped():
                for _ in range(min(1000, total - i)):
                    if i < steady:
                        due = first_due + i * window / max(steady, 1)
                    elif i < steady + burst:
                        due = burst_due
                    else:
                        due = first_due + 3600
                    record = core.validate_message(LogRecord(
                        kind=codec.KIND_NORMAL, topic=TOPIC, body=body, message_id="", queue_id=i % 8,
                        stored_ms=0, deliver_at_ms=int(due * 1000)))
                    core.db.apply(core.send_op(record), sync=False)
                    i += 1
        if time.time() > first_due - 3:
            raise RuntimeError("seeding took longer than estimated: raise START_DELAY_SECONDS")
        return first_due, burst_due
    finally:
        core.close()


def read_moved(data_dir: str) -> list[tuple[int, int]]:
    """(due ms, visible ms) of every message the timer moved into the topic's queues."""
    from services.broker.config import BrokerConfig
    from services.broker.core import BrokerCore
    from services.broker.store import codec

    core = BrokerCore(BrokerConfig(broker_name="broker-0", data_dir=data_dir, flush="async"))
    try:
        out = []
        for _key, value in core.db.scan("cq", codec.queue_prefix(TOPIC)):
            entry = codec.decode_cq_entry(value)
            record = core.read_message(entry.log_seq)
            if record is not None:
                out.append((record.deliver_at_ms, entry.visible_ms))
        return out
    finally:
        core.close()


def queued(address: str) -> int:
    import grpc

    from txmq.v1 import broker_pb2, broker_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        response = broker_pb2_grpc.BrokerServiceStub(channel).GetQueueOffsets(
            broker_pb2.GetQueueOffsetsRequest(topic=TOPIC), timeout=10)
    return sum(q.max_offset for q in response.queues)


def percentile(values: list[int], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)] if ordered else float("nan")


def run(name: str, steady: int, burst: int, backlog: int, window: float) -> dict[str, Any]:
    from services.common.process import ServiceProcess

    workdir = tempfile.mkdtemp(prefix="txmq-bench-delay-")
    data_dir = os.path.join(workdir, "broker-0")
    started = time.time()
    first_due, burst_due = seed(data_dir, steady, burst, backlog, window)
    seed_seconds = time.time() - started
    procs: list[Any] = []
    try:
        nameserver = ServiceProcess("services.nameserver", {}, workdir, "nameserver")
        procs.append(nameserver)
        nameserver.start_and_wait(30)
        broker = ServiceProcess("services.broker", {
            "TXMQ_NAMESERVER_ADDRESSES": nameserver.address, "TXMQ_DATA_DIR": data_dir, "TXMQ_FLUSH": "sync",
            "TXMQ_BROKER_NAME": "broker-0", "TXMQ_HEARTBEAT_INTERVAL_SECONDS": "1"}, workdir, "broker-0")
        procs.append(broker)
        broker.start_and_wait(60)
        if time.time() > first_due - 0.5:
            raise RuntimeError("the broker started after the first message was due: raise START_DELAY_SECONDS")
        wanted = steady + burst
        end = max(first_due + window, burst_due) + 60
        while queued(broker.address) < wanted and time.time() < end:
            time.sleep(0.25)
        for proc in reversed(procs):
            proc.stop(30)
        procs.clear()
        moved = read_moved(data_dir)
    finally:
        for proc in reversed(procs):
            proc.stop(30)
        shutil.rmtree(workdir, ignore_errors=True)
    burst_ms = int(burst_due * 1000)
    steady_late = [v - d for d, v in moved if d != burst_ms]
    burst_visible = [v for d, v in moved if d == burst_ms]
    early = sum(1 for d, v in moved if v < d)
    result: dict[str, Any] = {
        "scenario": name, "scheduled": steady + burst + backlog, "seed_seconds": round(seed_seconds, 1),
        "moved": len(moved), "expected": wanted, "early": early,
        "steady_p50_ms": percentile(steady_late, 0.5), "steady_p99_ms": percentile(steady_late, 0.99),
        "steady_max_ms": max(steady_late) if steady_late else float("nan"),
        "offered_per_second": round(steady / window),
    }
    if burst:
        took = (max(burst_visible) - burst_ms) / 1000 if burst_visible else float("nan")
        result["burst_moved"] = len(burst_visible)
        result["burst_seconds"] = round(took, 2)
        result["burst_per_second"] = round(len(burst_visible) / took) if took > 0 else float("nan")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scheduled", type=int, default=1_000_000)
    parser.add_argument("--due", type=int, default=50_000)
    parser.add_argument("--window", type=float, default=20.0)
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    small = run("small", args.due, 0, 0, args.window)
    large = run("large", args.due, args.due, args.scheduled - 2 * args.due, args.window)
    rows = [small, large]
    print(f"\n{'scenario':<8} {'scheduled':>10} {'seed s':>7} {'moved':>8} {'early':>6} {'offered/s':>10} "
          f"{'late p50 ms':>11} {'p99 ms':>7} {'max ms':>7} {'burst moved/s':>14}")
    for r in rows:
        print(f"{r['scenario']:<8} {r['scheduled']:>10} {r['seed_seconds']:>7} {r['moved']:>8} {r['early']:>6} "
              f"{r['offered_per_second']:>10} {r['steady_p50_ms']:>11} {r['steady_p99_ms']:>7} "
              f"{r['steady_max_ms']:>7} {r.get('burst_per_second', '-'):>14}")
    ratio = large["steady_p99_ms"] / max(small["steady_p99_ms"], 1)
    print(f"lateness p99 of the same steady stream with {large['scheduled']:,} scheduled ÷ with "
          f"{small['scheduled']:,}: {ratio:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "p99_ratio": ratio}, f, indent=2)
    if any(r["early"] for r in rows) or any(r["moved"] < r["expected"] for r in rows):
        raise SystemExit("messages moved early or not at all")


if __name__ == "__main__":
    main()
