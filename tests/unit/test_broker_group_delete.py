"""Deleting a consumer group on one broker (``groupdelete.py``) against a real RocksDB
directory with a controllable clock: one batch removes its cursors, in-flight rows, reset
records and remembered clients, and its names leave the quota index; a dry run and a
refusal change nothing; the receipts it held stay dead across a restart and never name a
delivery made after it; the group's dead letters are kept unless asked; the revoked-rows
codec."""

from __future__ import annotations

from typing import Any

import pytest

from services.broker import groupdelete, resets
from services.broker.core import BrokerCore, parse_tag_filter
from services.broker.store import codec
from services.broker.store.codec import LogRecord
from txmq.errors import GroupNotEmptyError, ReceiptHandleNotFoundError
from txmq.names import dlq_topic


@pytest.fixture
def make_core(make_core):
    def make(**overrides: Any) -> BrokerCore:
        return make_core(**{"consumer_session_seconds": 5.0, **overrides})
    return make


def send(core: BrokerCore, topic: str, body: bytes) -> None:
    core.db.call(core.send_op(core.validate_message(LogRecord(
        kind=codec.KIND_NORMAL, topic=topic, body=body, message_id="", queue_id=0, stored_ms=0))))


def receive(core: BrokerCore, group: str, topic: str, n: int = 16, seconds: float = 10.0):
    return core.db.call(core.receive_op(group, topic, -1, parse_tag_filter("*"), n, seconds)).deliveries


def rows(core: BrokerCore, group: str) -> list[tuple[str, bytes]]:
    prefix = group.encode() + codec.SEP
    out = [(cf, k) for cf in ("consumers", "inflight") for k, _ in core.db.scan(cf) if k.startswith(prefix)]
    return out + [("meta", k) for k in groupdelete.reset_keys(core, group)]


def delete(core: BrokerCore, group: str, **kw: Any) -> groupdelete.GroupDeletion:
    return core.db.call(groupdelete.delete_group_op(core, group, **{"dry_run": False, "operator": "ops", **kw}))


def test_one_batch_removes_the_groups_state_and_names(make_core, clock) -> None:
    core = make_core()
    for topic in ("orders", "audit"):
        core.db.call(core.create_topic_op(topic, 2))
        for i in range(4):
            send(core, topic, f"{topic}{i}".encode())
        for d in receive(core, "cg", topic):
            core.db.call(core.ack_op("cg", topic, [d.receipt_handle]))
        receive(core, "other", topic)
    core.db.call(resets.reset_op(core, "cg", "orders", resets.LATEST, dry_run=False, operator="ops"))
    assert core.consumers.names.has_group("cg") and rows(core, "cg")
    version = core.consumers.names.version
    dry = core.db.call(groupdelete.delete_group_op(core, "cg", dry_run=True))
    assert (dry.applied, dry.topics, dry.cursors, dry.resets) == (False, ["audit", "orders"], 4, 1)
    assert core.consumers.names.has_group("cg") and core.consumers.names.version == version  # nothing changed
    clock.advance(60)  # its consumers' sessions ended
    done = delete(core, "cg")
    assert done.applied and done.cursors == 4 and done.inflight == 0 and not done.live
    assert rows(core, "cg") == [] and not core.consumers.names.has_group("cg")
    assert not any(g == "cg" for (g, _t, _q) in core.consumers.cursors)
    assert not any(p[0] == "cg" for p in core.consumers.names.pairs)
    assert core.receivers.known("cg") == 0
    assert len([k for k in core.consumers.cursors if k[0] == "other"]) == 4  # another group keeps its place
    core.close()
    core = make_core()  # gone from the store, not only from memory
    assert not core.consumers.names.has_group("cg") and rows(core, "cg") == []
    again = receive(core, "cg", "orders")  # a new group: from the oldest retained entry
    assert sorted(d.offset for d in again) == [0, 1, 2, 3] and {d.attempt for d in again} == {1}


def test_live_consumers_refuse_it_unless_forced_and_held_receipts_stay_dead(make_core, clock) -> None:
    core = make_core()
    core.db.call(core.create_topic_op("orders", 1))
    for i in range(3):
        send(core, "orders", f"m{i}".encode())
    held = receive(core, "cg", "orders", n=2)
    core.receivers.received("cg", "orders", "consumer-1", "ipv4:127.0.0.1:5000", clock.ms)
    before = rows(core, "cg")
    with pytest.raises(GroupNotEmptyError, match="consumer-1"):
        delete(core, "cg")
    assert rows(core, "cg") == before and core.consumers.names.has_group("cg")  # refused: nothing changed
    done = delete(core, "cg", force=True)
    assert done.applied and done.inflight == 2 and [r.client_id for r in done.live] == ["consumer-1"]
    assert rows(core, "cg") == [] and not core.consumers.names.has_group("cg")
    for d in held:
        assert isinstance(core.db.call(core.ack_op("cg", "orders", [d.receipt_handle]))[0],
                          ReceiptHandleNotFoundError)
    core.close()
    core = make_core()
    again = receive(core, "cg", "orders")
    # The deleted deliveries' attempts count on: no receipt from before names one of these.
    assert [(d.offset, d.attempt) for d in again] == [(0, 2), (1, 2), (2, 1)]
    assert {d.receipt_handle for d in again}.isdisjoint({d.receipt_handle for d in held})
    for d in held:
        assert isinstance(core.db.call(core.ack_op("cg", "orders", [d.receipt_handle]))[0],
                          ReceiptHandleNotFoundError)
    assert not any(k.startswith(codec.REVOKED_PREFIX) for k, _ in core.db.scan("meta"))  # taken by the cursor


def test_dead_letters_are_kept_unless_asked(make_core, clock) -> None:
    core = make_core(max_delivery_attempts=1)
    core.db.call(core.create_topic_op("orders", 1))
    send(core, "orders", b"poison")
    receive(core, "cg", "orders", seconds=1.0)
    clock.advance(2)
    assert receive(core, "cg", "orders") == []  # dead-lettered
    dlq = dlq_topic("cg")
    clock.advance(60)
    kept = delete(core, "cg")
    assert kept.dead_letters == 1 and not kept.dead_letter_topic_deleted and dlq in core.queues.topics
    gone = delete(core, "cg", dead_letters=True)
    assert gone.cursors == 0 and gone.dead_letters == 1 and gone.dead_letter_topic_deleted
    assert dlq not in core.queues.topics and not list(core.db.scan("cq", codec.queue_prefix(dlq, 0),
                                                                   codec.cq_key(dlq, 0, 2**63 - 1)))


def test_revoked_rows_codec() -> None:
    value = codec.encode_revoked({7: 3, 2: 1})
    assert codec.decode_revoked(value) == {2: 1, 7: 3}
    assert codec.revoked_key("g", "t", 1).startswith(codec.REVOKED_PREFIX)
    with pytest.raises(codec.CorruptRecordError):
        codec.decode_revoked(value[:-1] + bytes([value[-1] ^ 1]))
