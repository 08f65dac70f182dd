"""The broker's key index and offset resets against a real RocksDB directory with a
controllable clock: the key index is written in the batch that puts a message into its
queue (a send, a commit, a delay coming due) and removed with its queue entry (retention,
topic deletion); a reset's revoked deliveries survive a restart (their receipts stay dead,
their attempts count on); the reset record; the live rule."""

from __future__ import annotations

from typing import Any

import pytest

from services.broker import lookups, resets, topics
from services.broker.core import BrokerCore, parse_tag_filter
from services.broker.store import codec
from services.broker.store.codec import LogRecord
from txmq.errors import ConsumersLiveError, ReceiptHandleNotFoundError


@pytest.fixture
def make_core(make_core):
    """The shared cores (tests/unit/conftest.py), with a short consumer session."""
    def make(**overrides: Any) -> BrokerCore:
        return make_core(**{"consumer_session_seconds": 5.0, **overrides})
    return make


def send(core: BrokerCore, body: bytes, keys: tuple[str, ...] = (), kind: int = codec.KIND_NORMAL, **kw: Any):
    record = core.validate_message(LogRecord(kind=kind, topic="orders", body=body, message_id="", queue_id=0,
                                             stored_ms=0, keys=keys, producer_group="pg" if kind == codec.KIND_HALF
                                             else "", **kw))
    return core.db.call(core.send_op(record))


def index(core: BrokerCore) -> list[bytes]:
    return [k for k, _ in core.db.scan("keys")]


def receive(core: BrokerCore, n: int = 16):
    return core.db.call(core.receive_op("cg", "orders", 0, parse_tag_filter("*"), n, 10.0)).deliveries


def test_the_key_index_follows_the_queue(make_core, clock) -> None:
    core = make_core(retention_seconds=60.0)
    core.db.call(core.create_topic_op("orders", 1))
    send(core, b"a", ("k1", "k2"))
    half = send(core, b"h", ("k1",), codec.KIND_HALF)
    send(core, b"later", ("k1",), deliver_at_ms=clock.ms + 10_000)
    assert sorted(f.record.body for f in lookups.by_key(core, "orders", "k1", 10)[0]) == [b"a"]
    core.db.call(core.end_op(half.transaction_id, "COMMIT", codec.SOURCE_CLIENT))
    assert sorted(f.record.body for f in lookups.by_key(core, "orders", "k1", 10)[0]) == [b"a", b"h"]
    clock.advance(11)
    core.db.call(core.timer_op())
    found, truncated = lookups.by_key(core, "orders", "k1", 2)
    assert [f.record.body for f in found] == [b"later", b"h"] and truncated  # newest first, cut at 2
    assert len(index(core)) == 4  # k1 ×3, k2 ×1
    for d in receive(core):
        core.db.call(core.ack_op("cg", "orders", [d.receipt_handle]))
    send(core, b"newest")  # retention keeps a queue's newest entry
    clock.advance(120)
    core.db.call(core.retention_op())
    assert index(core) == [] and lookups.by_key(core, "orders", "k1", 10)[0] == []
    send(core, b"again", ("k3",))
    assert len(index(core)) == 1
    core.db.call(topics.delete_topic_op(core, "orders", force=True))
    assert index(core) == []


def test_a_reset_revokes_deliveries_in_flight_and_survives_a_restart(make_core, clock) -> None:
    core = make_core()
    core.db.call(core.create_topic_op("orders", 1))
    for i in range(4):
        send(core, f"m{i}".encode())
    held = receive(core, n=2)
    assert [d.offset for d in held] == [0, 1]
    op = resets.reset_op(core, "cg", "orders", resets.EARLIEST, dry_run=False, force=True, operator="ops",
                         reason="replay")
    result = core.db.call(op)
    assert result.applied and result.queues[0].inflight_invalidated == 2
    core.close()
    core = make_core()  # the revoked rows and the new cursor come back from the store
    for d in held:
        assert core.db.call(core.ack_op("cg", "orders", [d.receipt_handle]))[0].__class__ is ReceiptHandleNotFoundError
    again = receive(core)
    assert [(d.offset, d.attempt) for d in again] == [(0, 2), (1, 2), (2, 1), (3, 1)]
    record = resets.last_reset(core, "cg", "orders")
    assert (record.operator, record.reason, record.target, record.at_ms) == ("ops", "replay", resets.EARLIEST,
                                                                          clock.ms)


def test_live_receivers_refuse_a_reset_until_their_session_ends(make_core, clock) -> None:
    core = make_core()
    core.db.call(core.create_topic_op("orders", 1))
    receiver = core.receivers.received("cg", "orders", "consumer-1", "ipv4:127.0.0.1:5000", clock.ms)
    op = resets.reset_op(core, "cg", "orders", resets.LATEST, dry_run=False, operator="ops")
    with pytest.raises(ConsumersLiveError):
        core.db.call(op)
    clock.advance(6)
    core.receivers.wait_begins(receiver, "orders")  # a long poll waiting now is live however old
    with pytest.raises(ConsumersLiveError):
        core.db.call(resets.reset_op(core, "cg", "orders", resets.LATEST, dry_run=False, operator="ops"))
    core.receivers.wait_ends(receiver, "orders", clock.ms)
    clock.advance(6)
    assert core.db.call(resets.reset_op(core, "cg", "orders", resets.LATEST, dry_run=False, operator="ops")).applied
    assert core.receivers.live("other-group", "orders", clock.ms) == []


def test_a_reset_to_a_time_finds_the_first_message_visible_then(make_core, clock) -> None:
    core = make_core()
    core.db.call(core.create_topic_op("orders", 1))
    stamps = []
    for i in range(20):
        stamps.append(clock.ms)
        send(core, f"m{i}".encode())
        clock.advance(1)
    for i, at in enumerate(stamps):
        plan = core.db.call(resets.reset_op(core, "cg", "orders", resets.TIME, timestamp_ms=at))
        assert plan.queues[0].new_offset == i
    after_all = core.db.call(resets.reset_op(core, "cg", "orders", resets.TIME, timestamp_ms=clock.ms + 1))
    assert after_all.queues[0].new_offset == 20
