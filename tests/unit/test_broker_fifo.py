"""FIFO delivery on the broker's domain (an in-process store, a fake clock): one delivery in
flight per message group, in queue order; groups in parallel; the held-back entries offered
again once their group is free; settled offsets past the cursor kept across a restart; the
topic type checked on send and kept."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest

from services.broker.core import BrokerCore, parse_tag_filter
from services.broker.delivery import MAX_FILTERED_SCAN
from services.broker.store import codec
from services.broker.store.codec import CqEntry, LogRecord
from tests.support.fifo_model import run_model
from txmq.errors import InvalidFieldError
from txmq.fifo import group_queue_index, message_group_hash



@pytest.fixture
def make_core(make_core):
    """The shared cores (tests/unit/conftest.py), dead-lettering after two deliveries unless
    told otherwise."""
    def make(**overrides: Any) -> BrokerCore:
        return make_core(**{"max_delivery_attempts": 2, **overrides})
    return make


@pytest.fixture
def core(make_core) -> BrokerCore:
    c = make_core()
    c.db.call(c.create_topic_op("fifo", 1, fifo=True))
    c.db.call(c.create_topic_op("plain", 1))
    return c


def send(core: BrokerCore, body: str, group: str, topic: str = "fifo") -> None:
    record = core.validate_message(LogRecord(kind=codec.KIND_NORMAL, topic=topic, body=body.encode(),
                                             message_id="", queue_id=0, stored_ms=0, message_group=group))
    core.db.call(core.send_op(record))


def receive(core: BrokerCore, n: int = 16, invisible: float = 10.0, group: str = "cg"):
    return core.db.call(core.receive_op(group, "fifo", -1, parse_tag_filter("*"), n, invisible)).deliveries


def body(core: BrokerCore, d) -> str:
    return core.read_message(d.log_seq).body.decode()


def ack(core: BrokerCore, *ds) -> None:
    assert core.db.call(core.ack_op("cg", "fifo", [d.receipt_handle for d in ds])) == [None] * len(ds)


def test_the_topic_type_is_checked_on_send_and_kept(core, make_core) -> None:
    with pytest.raises(InvalidFieldError) as missing:
        send(core, "x", "")
    assert missing.value.field == "message_group"
    with pytest.raises(InvalidFieldError) as grouped:
        send(core, "x", "g", topic="plain")
    assert grouped.value.field == "message_group"
    with pytest.raises(InvalidFieldError) as changed:
        core.db.call(core.create_topic_op("fifo", 2, fifo=False))
    assert changed.value.field == "topic_type"
    core.db.call(core.create_topic_op("fifo", 2))  # growing keeps the type
    core.close()
    again = make_core()
    assert again.fifo_topics == {"fifo"}
    entry = next(iter(again.db.scan("cq", codec.queue_prefix("fifo"))), None)
    assert entry is None  # nothing was stored by the refused sends


def test_one_in_flight_per_group_in_order_groups_in_parallel(core) -> None:
    for i in range(3):
        for g in "ab":
            send(core, f"{g}{i}", g)
    first = receive(core)
    assert sorted(body(core, d) for d in first) == ["a0", "b0"]
    assert receive(core) == []
    a0 = next(d for d in first if body(core, d) == "a0")
    ack(core, a0)
    (a1,) = receive(core)
    assert body(core, a1) == "a1"
    ack(core, a1)
    (a2,) = receive(core)
    assert body(core, a2) == "a2"
    # b1 (offset 3) waits for b0: the cursor stays before it; a2 (4) is delivered past it,
    # and once acknowledged it is remembered as settled past the cursor.
    cursor = core.consumers.get("cg", "fifo", 0)
    assert cursor.next_offset == 3 and 4 in cursor.inflight
    ack(core, a2)
    assert cursor.settled == {4}
    assert receive(core) == []  # a is done, b waits for b0


def test_redelivery_keeps_the_group_and_a_dead_letter_frees_it(core, clock) -> None:
    send(core, "m0", "g")
    send(core, "m1", "g")
    (d,) = receive(core, invisible=1.0)
    clock.advance(1.5)
    (again,) = receive(core, invisible=1.0)
    assert body(core, again) == "m0" and again.attempt == 2
    clock.advance(1.5)  # the 2nd of max_delivery_attempts=2 expired: dead-lettered
    (nxt,) = receive(core)
    assert body(core, nxt) == "m1"


def test_settled_offsets_and_held_groups_survive_a_restart(core, make_core) -> None:
    for i in range(3):
        for g in "ab":
            send(core, f"{g}{i}", g)
    first = receive(core)
    a0, b0 = sorted(first, key=lambda d: body(core, d))
    ack(core, a0)
    (a1,) = receive(core)
    ack(core, a1)
    (a2,) = receive(core)
    ack(core, a2)  # past the cursor, which b1 holds: remembered as settled in the store
    core.close()
    restarted = make_core()
    assert receive(restarted) == []  # a is done (nothing redelivered), b0 still in flight
    assert restarted.db.call(restarted.ack_op("cg", "fifo", [b0.receipt_handle])) == [None]
    assert [body(restarted, d) for d in receive(restarted)] == ["b1"]


def test_a_random_run_delivers_every_group_in_order(make_core, clock) -> None:
    core = make_core(max_delivery_attempts=100)  # nothing dead-lettered: every message is owed
    core.db.call(core.create_topic_op("fifo", 1, fifo=True))
    rng = random.Random(7)
    groups = [f"g{i}" for i in range(20)]
    sent = {g: 0 for g in groups}
    for _ in range(400):
        g = rng.choice(groups)
        send(core, f"{g}:{sent[g]}", g)
        sent[g] += 1
    done = {g: -1 for g in groups}
    for _ in range(5000):
        batch = receive(core, n=rng.randint(1, 8), invisible=1.0)
        for d in batch:
            g, seq = body(core, d).split(":")
            assert int(seq) == done[g] + 1, (g, seq, done[g])
            if rng.random() < 0.2:
                continue  # not acknowledged: redelivered after its invisibility
            ack(core, d)
            done[g] = int(seq)
        clock.advance(rng.choice([0.0, 0.0, 1.5]))
        if all(done[g] == sent[g] - 1 for g in groups):
            break
    assert done == {g: sent[g] - 1 for g in groups}


def test_entries_held_back_are_bounded_and_rescanned(core) -> None:
    for i in range(MAX_FILTERED_SCAN + 10):
        send(core, f"h{i}", "hot")
    send(core, "cold", "cold")
    (h0,) = receive(core)
    assert body(core, h0) == "h0"
    assert receive(core) == []  # the window of held-back "hot" entries is full: "cold" waits
    cursor = core.consumers.get("cg", "fifo", 0)
    assert len(cursor.ahead) == MAX_FILTERED_SCAN
    ack(core, h0)
    (h1,) = receive(core, n=1)
    assert body(core, h1) == "h1"


def test_queue_entries_and_log_records_carry_the_group() -> None:
    entry = CqEntry(5, 6, "t", message_group_hash("g"))
    assert codec.decode_cq_entry(codec.encode_cq_entry(entry)) == entry
    record = LogRecord(kind=codec.KIND_NORMAL, topic="t", body=b"b", message_id="m", queue_id=0, stored_ms=1,
                       message_group="order-1")
    value = codec.encode_log_record(record)
    assert codec.decode_log_record(value) == record
    assert codec.decode_log_routing(value) == ("", 0, "order-1")
    timed = dataclasses.replace(record, deliver_at_ms=99)
    assert codec.decode_log_routing(codec.encode_log_record(timed)) == ("", 99, "order-1")
    assert message_group_hash("") == 0 and message_group_hash("g") == message_group_hash("g") != 0
    assert {group_queue_index(f"g{i}", 8) for i in range(100)} == set(range(8))


def test_a_postponement_to_the_same_deadline_redelivers_once(core, clock) -> None:
    """ChangeInvisibleDuration to the deadline the delivery already had leaves two equal
    entries in the redelivery heap: the message is still redelivered once, not twice with
    one attempt number (two copies of one group's message in flight)."""
    send(core, "m0", "g")
    (d,) = receive(core, invisible=1.0)
    clock.advance(0.5)
    core.db.call(core.change_invisible_op("cg", "fifo", d.receipt_handle, 0.5))  # the same deadline
    clock.advance(0.6)
    again = receive(core)
    assert [(body(core, x), x.attempt) for x in again] == [("m0", 2)]


@pytest.mark.parametrize(("seed", "window"), [(1, None), (2, 4), (3, 4)])
def test_random_interleavings_with_restarts_keep_every_group_in_order(tmp_path, seed, window) -> None:
    """The seeded model check of tests/support/fifo_model.py: sends, receives, acks of
    current and stale receipt handles, postponements (to the same deadline too), expiries,
    dead letters, forgetful consumers and broker restarts interleaved at random, with the
    held-back window shrunk to 4 entries in some runs; a few seeds here, hundreds in
    ``make chaos`` (``python -m tests.chaos_fifo --model-seeds N``). A failure names its
    seed: ``run_model(seed, path)`` replays it exactly."""
    stats = run_model(seed, tmp_path, steps=900, window=window)
    assert stats["acks"] > 0 and stats["redeliveries"] > 0 and stats["restarts"] > 0, stats
