"""A randomized model check of FIFO delivery on the broker's domain (``BrokerCore`` on a
real RocksDB store, a fake clock), seeded so that a failure is replayed exactly.

One run draws from its seed a FIFO topic (1-3 queues), 1-20 message groups, two consumer
groups and a maximum of delivery attempts (3: dead letters happen, or 10,000), then
interleaves: sends, receives (any queue or one, 1-8 messages, invisibilities from the
0.05 s floor to 2 s), acknowledgements (of current and of stale receipt handles),
invisibility changes (to the same deadline too), the clock moving past deadlines,
consumers forgetting what they hold (a crashed consumer), and broker restarts (a SIGKILL:
every operation's writes are in the store when it returns, so a restart from the store is
the state a kill leaves). Optionally the held-back window (``MAX_FILTERED_SCAN``) is
shrunk so that it overflows. Then it drains: receive and acknowledge everything.

Checked on every delivery and at the end:

- in order: a message of a group is delivered only once every earlier message of its group
  was acknowledged or dead-lettered for that consumer group;
- one delivery in flight per message: a message's delivery attempts only grow (two
  deliveries with one attempt number are two copies in flight);
- an acknowledgement is accepted only for the latest delivery of a message not yet
  settled (a stale receipt handle is refused);
- a dead-lettered message is never delivered again;
- nothing lost: in the end every message was acknowledged or dead-lettered.
"""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from pathlib import Path

import services.broker.delivery as delivery
from services.broker.config import BrokerConfig
from services.broker.core import BrokerCore, parse_tag_filter
from services.broker.store import codec
from services.broker.store.codec import LogRecord
from txmq.errors import ReceiptHandleNotFoundError
from txmq.fifo import group_queue_index
from txmq.names import dlq_topic

TOPIC = "fifo"


class _Clock:
    def __init__(self) -> None:
        self.ms = 1_700_000_000_000

    def __call__(self) -> int:
        return self.ms


@dataclasses.dataclass
class _Group:
    """What the model knows of one consumer group."""

    name: str
    acked: dict[str, set[int]]
    dead: dict[str, set[int]]
    held: list[tuple[str, int, object]] = dataclasses.field(default_factory=list)
    latest: dict[tuple[int, int], int] = dataclasses.field(default_factory=dict)  # (queue, offset) → attempt
    dlq_read: int = 0

    def settled(self, g: str, seq: int) -> bool:
        return seq in self.acked[g] or seq in self.dead[g]


def run_model(seed: int, workdir: Path, *, steps: int = 2500, window: int | None = None) -> Counter[str]:
    """One seeded run (see the module docstring); returns what happened, counted. Raises
    AssertionError naming the seed and the last events on a violation."""
    saved = delivery.MAX_FILTERED_SCAN
    if window is not None:
        delivery.MAX_FILTERED_SCAN = window
    try:
        return _run(seed, workdir, steps)
    finally:
        delivery.MAX_FILTERED_SCAN = saved


def _run(seed: int, workdir: Path, steps: int) -> Counter[str]:
    rng = random.Random(seed)
    clock = _Clock()
    queues = rng.choice([1, 2, 3])
    max_attempts = rng.choice([3, 10_000, 10_000])
    config = BrokerConfig(data_dir=str(workdir / f"model-{seed}"), flush="async",
                          max_delivery_attempts=max_attempts, min_invisible_duration_seconds=0.05)
    core = BrokerCore(config, clock=clock)
    core.db.call(core.create_topic_op(TOPIC, queues, fifo=True))
    names = [f"g{i}" for i in range(rng.choice([1, 3, 8, 20]))]
    sent = {g: 0 for g in names}
    groups = [_Group(cg, {g: set() for g in names}, {g: set() for g in names}) for cg in ("cg-a", "cg-b")]
    stats: Counter[str] = Counter()
    events: list[tuple] = []

    def fail(what: str, *detail: object) -> None:
        raise AssertionError(f"FIFO model seed {seed}: {what} {detail}; last events {events[-25:]}")

    def body(d) -> tuple[str, int]:
        g, seq = core.read_message(d.log_seq).body.decode().split(":")
        return g, int(seq)

    def send(g: str) -> None:
        record = core.validate_message(LogRecord(
            kind=codec.KIND_NORMAL, topic=TOPIC, body=f"{g}:{sent[g]}".encode(), message_id="",
            queue_id=group_queue_index(g, queues), stored_ms=0, message_group=g))
        core.db.call(core.send_op(record))
        sent[g] += 1
        stats["sent"] += 1

    def read_dead_letters(cg: _Group) -> None:
        dlq = dlq_topic(cg.name)
        if dlq not in core.topics:
            return
        entries, cg.dlq_read = core.read_queue(dlq, 0, cg.dlq_read, 0, 1000)
        for _offset, entry in entries:
            g, seq = (core.read_message(entry.log_seq).body.decode().split(":"))
            cg.dead[g].add(int(seq))
            stats["dead-lettered"] += 1
            events.append(("dead", cg.name, g, int(seq)))

    def receive(cg: _Group, n: int, invisible: float) -> list:
        queue_id = -1 if queues == 1 or rng.random() < 0.7 else rng.randrange(queues)
        out = core.db.call(core.receive_op(cg.name, TOPIC, queue_id, parse_tag_filter("*"), n,
                                           invisible)).deliveries
        read_dead_letters(cg)
        for d in out:
            g, seq = body(d)
            events.append(("recv", cg.name, g, seq, d.attempt))
            missing = [s for s in range(seq) if not cg.settled(g, s)]
            if missing:
                fail("delivered out of order", cg.name, g, seq, "before", missing[:5])
            if seq in cg.dead[g]:
                fail("a dead letter delivered again", cg.name, g, seq)
            previous = cg.latest.get((d.queue_id, d.offset), 0)
            if d.attempt <= previous:
                fail("two deliveries with one attempt number", cg.name, g, seq, previous, d.attempt)
            cg.latest[(d.queue_id, d.offset)] = d.attempt
            cg.held.append((g, seq, d))
            stats["redeliveries" if d.attempt > 1 else "deliveries"] += 1
        return out

    def ack(cg: _Group, g: str, seq: int, d) -> None:
        result = core.db.call(core.ack_op(cg.name, TOPIC, [d.receipt_handle]))[0]
        current = cg.latest.get((d.queue_id, d.offset)) == d.attempt and not cg.settled(g, seq)
        if result is None:
            if not current:
                fail("a stale receipt handle was acknowledged", cg.name, g, seq, d.attempt)
            cg.acked[g].add(seq)
            stats["acks"] += 1
            events.append(("ack", cg.name, g, seq, d.attempt))
        else:
            if not isinstance(result, ReceiptHandleNotFoundError):
                fail("an acknowledgement failed", cg.name, g, seq, repr(result))
            stats["stale acks"] += 1
            events.append(("ack refused", cg.name, g, seq, d.attempt))

    for _ in range(steps):
        cg = rng.choice(groups)
        r = rng.random()
        if r < 0.25:
            send(rng.choice(names))
        elif r < 0.5:
            receive(cg, rng.randint(1, 8), rng.choice([0.05, 0.5, 1.0, 2.0]))
        elif r < 0.7 and cg.held:
            g, seq, d = cg.held.pop(rng.randrange(len(cg.held)))
            ack(cg, g, seq, d)
        elif r < 0.78 and cg.held:
            k = rng.randrange(len(cg.held))
            g, seq, d = cg.held[k]
            # Sometimes exactly the deadline it has (two equal entries in the redelivery heap).
            seconds = rng.choice([0.0, 0.05, 0.3, 1.0, max((d.deadline_ms - clock.ms) / 1000, 0.05)])
            try:
                handle, deadline = core.db.call(core.change_invisible_op(cg.name, TOPIC, d.receipt_handle, seconds))
                cg.held[k] = (g, seq, dataclasses.replace(d, receipt_handle=handle, deadline_ms=deadline))
                stats["invisibility changes"] += 1
                events.append(("postpone", cg.name, g, seq, d.attempt, seconds))
            except ReceiptHandleNotFoundError:
                cg.held.pop(k)
        elif r < 0.9:
            clock.ms += rng.choice([0, 10, 50, 300, 1100, 2500])
        elif r < 0.93 and cg.held:
            cg.held.pop(rng.randrange(len(cg.held)))  # its consumer crashed
        elif r < 0.94:
            core.close()
            core = BrokerCore(config, clock=clock)
            stats["restarts"] += 1
            events.append(("restart",))
    for cg in groups:
        for _ in range(50_000):
            if all(len(cg.acked[g] | cg.dead[g]) == sent[g] for g in names):
                break
            out = receive(cg, 16, 0.5)
            for g, seq, d in cg.held:
                ack(cg, g, seq, d)
            cg.held.clear()
            if not out:
                clock.ms += 600
        lost = {g: sorted(set(range(sent[g])) - cg.acked[g] - cg.dead[g])[:5] for g in names
                if len(cg.acked[g] | cg.dead[g]) != sent[g]}
        if lost:
            fail("messages never delivered", cg.name, lost)
    core.close()
    return stats
