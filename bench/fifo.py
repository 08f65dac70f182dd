"""FIFO message groups against unordered delivery, in the same run: what ordering per
message group costs the producers and the consumers.

    python -m bench.fifo [--messages 20000] [--groups 1000] [--queues 8] [--producers 8]
                         [--consumers 4] [--json FILE]

A name server and a broker (``flush=sync``) start as processes; two topics of ``queues``
queues each: a normal one and a FIFO one. For each topic, in turn:

- *send*: ``producers`` threads (one ``txmq.Producer`` each) send ``messages`` messages;
  on the FIFO topic each carries one of ``groups`` message groups (message i of producer p
  → group (p + i × producers) mod groups, so every group is sent in order by one producer);
- *consume*: ``consumers`` threads (one ``txmq.SimpleConsumer`` each) receive batches of up
  to 32 and acknowledge each batch at once, until every message is consumed. On the FIFO
  topic the broker holds back a group's next message until the previous one is
  acknowledged, so at most ``groups`` messages are in flight; the order per group is
  checked (a message delivered before its group's previous one is counted and must be 0).

Printed: messages per second for each phase and topic (work ÷ the time it took), and the
FIFO ÷ unordered ratios.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import threading
import time
from typing import Any

BATCH = 32


def send_all(nameserver: str, topic: str, messages: int, producers: int, groups: int) -> float:
    """Sends ``messages`` messages from ``producers`` threads; returns messages per second."""
    import txmq

    per = messages // producers
    errors: list[BaseException] = []

    def produce(p: int) -> None:
        try:
            with txmq.Producer(nameserver) as producer:
                for i in range(per):
                    group = f"g{(p + i * producers) % groups}" if groups else ""
                    producer.send(txmq.Message(topic, f"{p}:{i}".encode(), message_group=group))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=produce, args=(p,)) for p in range(producers)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took = time.monotonic() - started
    if errors:
        raise errors[0]
    return per * producers / took


def consume_all(nameserver: str, topic: str, total: int, consumers: int) -> tuple[float, int]:
    """Consumes ``total`` messages on ``consumers`` threads; returns (messages per second,
    order violations: a message of a producer's sequence delivered before an earlier one
    of the same group was acknowledged)."""
    import txmq

    lock = threading.Lock()
    done = 0
    acked: dict[str, int] = {}  # group → highest sequence acknowledged (FIFO topic)
    violations = 0
    stop = threading.Event()
    first: list[float] = []  # when the first batch arrived: connecting is not the work measured

    def consume() -> None:
        nonlocal done, violations
        with txmq.SimpleConsumer(nameserver, consumer_group=f"{topic}-bench", subscriptions={topic: "*"},
                                 await_duration_seconds=1.0) as consumer:
            while not stop.is_set():
                batch = consumer.receive(BATCH, 30.0)
                if not batch:
                    continue
                with lock:
                    if not first:
                        first.append(time.monotonic())
                    for m in batch:
                        if m.message_group and m.delivery_attempt == 1:
                            seq = int(m.body.split(b":")[1])
                            if seq < acked.get(m.message_group, -1):
                                violations += 1
                            acked[m.message_group] = seq
                consumer.ack_many(batch)
                with lock:
                    done += len(batch)
                    if done >= total:
                        stop.set()

    threads = [threading.Thread(target=consume) for _ in range(consumers)]
    for t in threads:
        t.start()
    while not stop.wait(0.05):
        if not any(t.is_alive() for t in threads):
            raise RuntimeError("every consumer thread ended before the messages were consumed")
    took = time.monotonic() - first[0]
    for t in threads:
        t.join(30)
    return total / took, violations


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--groups", type=int, default=1000)
    parser.add_argument("--queues", type=int, default=8)
    parser.add_argument("--producers", type=int, default=8)
    parser.add_argument("--consumers", type=int, default=4)
    parser.add_argument("--json", default="")
    args = parser.parse_args()

    from services.common.process import ServiceProcess
    from txmq import Admin

    workdir = tempfile.mkdtemp(prefix="txmq-bench-fifo-")
    procs: list[Any] = []
    rows: dict[str, dict[str, Any]] = {}
    try:
        nameserver = ServiceProcess("services.nameserver", {}, workdir, "nameserver")
        procs.append(nameserver)
        nameserver.start_and_wait(30)
        broker = ServiceProcess("services.broker", {
            "TXMQ_NAMESERVER_ADDRESSES": nameserver.address, "TXMQ_DATA_DIR": f"{workdir}/broker-0",
            "TXMQ_FLUSH": "sync", "TXMQ_BROKER_NAME": "broker-0", "TXMQ_HEARTBEAT_INTERVAL_SECONDS": "1"},
            workdir, "broker-0")
        procs.append(broker)
        broker.start_and_wait(60)
        with Admin(nameserver.address) as admin:
            for name, fifo in (("unordered", False), ("fifo", True)):
                deadline = time.monotonic() + 30
                while True:
                    try:
                        admin.create_topic(f"bench-{name}", queue_count=args.queues, fifo=fifo)
                        break
                    except Exception:  # the broker registers first
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(0.5)
        # A warm-up round (not measured) on the normal topic, then the two measured.
        for name, groups, total in (("warm-up", 0, 20 * args.producers), ("unordered", 0, args.messages),
                                    ("fifo", args.groups, args.messages)):
            topic = "bench-unordered" if name == "warm-up" else f"bench-{name}"
            total = total // args.producers * args.producers
            sent = send_all(nameserver.address, topic, total, args.producers, groups)
            consumed, violations = consume_all(nameserver.address, topic, total, args.consumers)
            if name == "warm-up":
                continue
            rows[name] = {"messages": total, "groups": groups, "send_per_second": round(sent),
                          "consume_per_second": round(consumed), "order_violations": violations}
    finally:
        for proc in reversed(procs):
            proc.stop(30)
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"\n{'topic':<10} {'messages':>9} {'groups':>7} {'send/s':>8} {'consume/s':>10} {'order violations':>17}")
    for name, r in rows.items():
        print(f"{name:<10} {r['messages']:>9} {r['groups']:>7} {r['send_per_second']:>8} "
              f"{r['consume_per_second']:>10} {r['order_violations']:>17}")
    send_ratio = rows["fifo"]["send_per_second"] / rows["unordered"]["send_per_second"]
    consume_ratio = rows["fifo"]["consume_per_second"] / rows["unordered"]["consume_per_second"]
    print(f"FIFO ({args.groups} groups) ÷ unordered: send {send_ratio:.2f}, consume {consume_ratio:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "send_ratio": send_ratio, "consume_ratio": consume_ratio}, f, indent=2)
    if rows["fifo"]["order_violations"]:
        raise SystemExit("a FIFO message was delivered before its group's previous one")


if __name__ == "__main__":
    main()
