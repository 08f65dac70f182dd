"""Resetting a consumer group's position (Kafka's ``kafka-consumer-groups --reset-offsets``,
RocketMQ's ``mqadmin resetOffsetByTime``): after a bad deploy consumed messages wrongly,
move the group back to a time and consume again.

    python examples/offset_reset.py --nameserver 127.0.0.1:9876

Written against the Admin API of the offset-reset work (issue 32 item 1, the ``ops``
branch): ``Admin.reset_offsets(group, topic, to_time=..., dry_run=..., force=...)`` answering
per queue the current and new offsets, and the group's live consumers. Consumes everything,
resets the group to before the second half was sent (a dry run first), and checks that
exactly the second half comes again. A broker counts a consumer live for
``consumer_session_seconds`` after its last receive, and refuses a reset under live
consumers: the only one here is this script's own, closed, so the reset is forced. Exits 0
when it worked; 2 when this SDK has no offset reset yet.
"""

from __future__ import annotations

import datetime as dt
import sys
import time
import uuid

import txmq
from _common import arguments, ensure_topic


def consume(nameserver: str, topic: str, group: str, want: int, run: str) -> list[bytes]:
    got: list[bytes] = []
    with txmq.SimpleConsumer(nameserver, consumer_group=group, subscriptions={topic: "*"},
                             await_duration_seconds=1.0) as consumer:
        deadline = time.monotonic() + 30
        while len(got) < want and time.monotonic() < deadline:
            for m in consumer.receive(16):
                consumer.ack(m)
                if m.body.startswith(f"event {run}".encode()):
                    got.append(m.body)
    return got


def main() -> int:
    args = arguments(__doc__.splitlines()[0], "Events")
    if not hasattr(txmq.Admin, "reset_offsets"):
        print("this txmq has no Admin.reset_offsets yet (issue 32 item 1)")
        return 2
    ensure_topic(args.nameserver, args.topic, queue_count=2)
    run, group = uuid.uuid4().hex[:8], f"reset-example-{uuid.uuid4().hex[:8]}"
    half = max(1, args.count // 2)
    with txmq.Producer(args.nameserver) as producer:
        for i in range(half):
            producer.send(txmq.Message(args.topic, f"event {run} {i}".encode()))
        time.sleep(0.05)
        cut = dt.datetime.now(dt.UTC)
        time.sleep(0.05)
        second = [f"event {run} {i}".encode() for i in range(half, args.count)]
        for body in second:
            producer.send(txmq.Message(args.topic, body))
    first_pass = consume(args.nameserver, args.topic, group, args.count, run)
    with txmq.Admin(args.nameserver) as admin:
        plan = admin.reset_offsets(group, args.topic, to_time=cut, dry_run=True)
        for q in plan.queues:
            print(f"dry run: queue {q.queue_id} {q.current_offset} -> {q.new_offset} ({q.lag_change:+d} again)")
        print(f"live consumers (this script's own, closed): {len(plan.live_consumers)}")
        admin.reset_offsets(group, args.topic, to_time=cut, dry_run=False, force=True,
                            operator="offset-reset-example", reason="replay after a bad deploy")
    again = consume(args.nameserver, args.topic, group, len(second), run)
    print(f"first pass {len(first_pass)}, after the reset {len(again)}")
    return 0 if len(first_pass) == args.count and sorted(again) == sorted(second) else 1


if __name__ == "__main__":
    sys.exit(main())
