"""Multi-message (global) transactions in the broker's domain (``services/broker/globaltx.py``)
against a real RocksDB directory: a coordinator and a participant are two cores (two
shards), the pushes and pulls the pump would make are made by hand."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from services.broker.config import BrokerConfig
from services.broker.core import BrokerCore, parse_tag_filter
from services.broker.model import STATE_COMMITTED, STATE_DISCARDED, STATE_PREPARED, STATE_ROLLED_BACK
from services.broker.store import codec, globalcodec
from services.broker.store.codec import LogRecord
from txmq.errors import InvalidFieldError, TransactionNotFoundError, TransactionStateError
from txmq.ids import MessageId
from txmq.names import GLOBAL_TRANSACTION_PROPERTY, discard_topic


@pytest.fixture
def shards(tmp_path, clock):
    made: list[BrokerCore] = []

    def make(name: str) -> BrokerCore:
        config = dataclasses.replace(BrokerConfig(data_dir=str(tmp_path / name), flush="async", broker_name=name,
                                                  transaction_timeout_seconds=6.0))
        core = BrokerCore(config, clock=clock)
        core.db.call(core.create_topic_op("orders", 2))
        made.append(core)
        return core

    yield make
    for core in made:
        core.close()


def half(core: BrokerCore, *, begin: bool = False, participants: tuple[str, ...] = (), gid: str = "",
         group: str = "pg", body: bytes = b"b", message_id: str = "") -> Any:
    record = core.validate_message(LogRecord(
        kind=codec.KIND_HALF, topic="orders", body=body, queue_id=0, stored_ms=0, producer_group=group,
        message_id=message_id or MessageId.new(core.name, 0).encode()))
    return core.db.call(core.global_send_op(record, begin=begin, participants=list(participants), global_id=gid))


def live_rows(core: BrokerCore) -> list[bytes]:
    """The ``global`` rows holding live work (not the M rows that index every part)."""
    return [k for k, _ in core.db.scan("global") if k[:1] != globalcodec.MEMBER]


def visible(core: BrokerCore) -> list[bytes]:
    out = []
    for q in (0, 1):
        deliveries = core.db.call(core.receive_op("cg", "orders", q, parse_tag_filter("*"), 64, 60.0)).deliveries
        out += [core.read_message(d.log_seq).body for d in deliveries]
    return sorted(out)


def test_single_shard_commit_makes_every_part_visible_in_one_batch(shards):
    a = shards("a")
    first = half(a, begin=True, body=b"1")
    gid = first.transaction_id
    half(a, gid=gid, body=b"2")
    half(a, gid=gid, body=b"3")
    assert visible(a) == []
    assert a.due_pulls(a.clock() + 10**9) == []  # parts on the coordinator never ask
    writes_before = a.db.written
    a.db.call(a.end_op(gid, "COMMIT", codec.SOURCE_CLIENT))
    assert a.db.written == writes_before + 1  # one batch
    assert visible(a) == [b"1", b"2", b"3"]
    for d in a.db.call(a.receive_op("cg2", "orders", 0, parse_tag_filter("*"), 64, 60.0)).deliveries:
        assert a.read_message(d.log_seq).properties[GLOBAL_TRANSACTION_PROPERTY] == gid
    assert live_rows(a) == []  # nothing live is left


def test_parts_are_never_checked_and_refuse_a_decision_of_their_own(shards, clock):
    a = shards("a")
    gid = half(a, begin=True).transaction_id
    part = half(a, gid=gid)
    with pytest.raises(InvalidFieldError, match="part of global transaction"):
        a.db.call(a.end_op(part.transaction_id, "COMMIT", codec.SOURCE_CLIENT))
    clock.ms += 60_000
    claimed = a.db.call(a.claim_op(["pg"], 100, 10.0))
    assert [c.row.seq for c in claimed] == [a.parse_txn_id(gid)]  # G is checked, its part is not
    a.db.call(a.end_op(gid, "ROLLBACK", codec.SOURCE_CLIENT))
    assert visible(a) == []
    assert a.get_txn(part.transaction_id).state == STATE_ROLLED_BACK


def test_cross_shard_commit_pushes_and_applies_once(shards):
    a, b = shards("a"), shards("b")
    gid = half(a, begin=True, participants=("b",), body=b"a1").transaction_id
    p1 = half(b, gid=gid, body=b"b1")
    half(b, gid=gid, body=b"b2")
    a.db.call(a.end_op(gid, "COMMIT", codec.SOURCE_CLIENT))
    assert visible(a) == [b"a1"] and visible(b) == []
    assert a.pushes() == [(gid, STATE_COMMITTED, codec.SOURCE_CLIENT, ["b"])]
    intruder = half(b, gid=gid, group="other")  # tagged with G by another group: never committed with it
    assert b.db.call(b.apply_global_op(gid, STATE_COMMITTED, codec.SOURCE_CLIENT, "pg")) == 3
    assert b.get_txn(intruder.transaction_id).state == STATE_ROLLED_BACK
    assert b.db.call(b.apply_global_op(gid, STATE_COMMITTED, codec.SOURCE_CLIENT)) == 0  # a repeat
    assert visible(b) == [b"b1", b"b2"]
    assert b.get_txn(p1.transaction_id).state == STATE_COMMITTED
    a.db.call(a.push_done_op(gid, "b", STATE_COMMITTED))
    assert a.pushes() == [] and live_rows(a) == []


def test_a_participant_pulls_after_the_timeout_and_survives_restart(shards, clock, tmp_path):
    a, b = shards("a"), shards("b")
    gid = half(a, begin=True).transaction_id  # b not named: only a pull tells it
    half(b, gid=gid)
    assert b.due_pulls(clock()) == []
    clock.ms += 6_000
    assert b.due_pulls(clock()) == [gid]
    assert a.resolve_global(gid).state == STATE_PREPARED
    a.db.call(a.end_op(gid, "COMMIT", codec.SOURCE_CLIENT))
    assert a.pushes() == []  # nobody to push to
    # b restarts before it asks: its undecided part and the pull come back from the store
    b.close()
    b2 = BrokerCore(b.config, clock=clock)
    assert b2.due_pulls(clock()) == []  # a restarted participant waits a timeout for a push first
    clock.ms += 6_000
    assert b2.due_pulls(clock()) == [gid]
    row = a.resolve_global(gid)
    b2.db.call(b2.apply_global_op(gid, row.state, row.source, row.producer_group))
    assert visible(b2) == [b"b"]
    b2.close()


def test_refusals(shards):
    a, b = shards("a"), shards("b")
    gid = half(a, begin=True).transaction_id
    with pytest.raises(InvalidFieldError, match="group"):
        half(a, gid=gid, group="other")
    with pytest.raises(InvalidFieldError, match="only with begin_global"):
        half(a, participants=("b",))
    with pytest.raises(InvalidFieldError, match="reserved"):
        a.db.call(a.global_send_op(a.validate_message(LogRecord(
            kind=codec.KIND_NORMAL, topic="orders", body=b"x", queue_id=0, stored_ms=0,
            message_id=MessageId.new("a", 0).encode(), properties={GLOBAL_TRANSACTION_PROPERTY: gid})),
            begin=False, participants=[], global_id=""))
    a.db.call(a.end_op(gid, "COMMIT", codec.SOURCE_CLIENT))
    with pytest.raises(TransactionStateError):
        half(a, gid=gid)  # G decided: no further part
    plain = a.db.call(a.send_op(a.validate_message(LogRecord(
        kind=codec.KIND_HALF, topic="orders", body=b"x", queue_id=0, stored_ms=0, producer_group="pg",
        message_id=MessageId.new("a", 0).encode())))).transaction_id
    with pytest.raises(InvalidFieldError, match="does not begin"):
        half(a, gid=plain)
    with pytest.raises(InvalidFieldError, match="coordinated here"):
        a.apply_global_op(gid, STATE_COMMITTED, codec.SOURCE_CLIENT)
    with pytest.raises(TransactionNotFoundError):
        a.resolve_global(a.txn_id(10_000))
    before = list(b.db.scan("txn"))
    with pytest.raises(InvalidFieldError):
        half(b, gid=gid, begin=True)
    assert list(b.db.scan("txn")) == before  # a refusal changes nothing


def test_global_rows_round_trip_and_a_corrupt_one_is_reported():
    from services.broker.store import globalcodec
    from services.broker.store.codec import CorruptRecordError
    assert globalcodec.decode_participants(globalcodec.encode_participants(["b", "c"])) == ["b", "c"]
    assert globalcodec.decode_push(globalcodec.encode_push(2, 1, ["b"])) == (2, 1, ["b"])
    assert globalcodec.split_part_key(globalcodec.part_key("T-g", 7)) == ("T-g", 7)
    value = bytearray(globalcodec.encode_push(2, 1, ["b"]))
    value[-1] ^= 0xFF
    with pytest.raises(CorruptRecordError):
        globalcodec.decode_push(bytes(value))


def test_fsck_checks_the_global_rows(shards):
    a = shards("a")
    gid = half(a, begin=True).transaction_id
    half(a, gid=gid)
    assert a.global_problems() == []
    a.db.call(a.end_op(gid, "COMMIT", codec.SOURCE_CLIENT))
    assert a.global_problems() == []
    from services.broker.store import globalcodec
    a.db.call(lambda w: w.put("global", globalcodec.open_key(a.parse_txn_id(gid)), globalcodec.encode_participants([])))
    assert "is open but its row is COMMITTED" in a.global_problems()[0]


def discarded(core: BrokerCore) -> list[bytes]:
    if discard_topic("pg") not in core.topics:
        return []
    deliveries = core.db.call(core.receive_op("ops", discard_topic("pg"), 0, parse_tag_filter("*"), 64, 60.0)).deliveries
    return sorted(core.read_message(d.log_seq).body for d in deliveries)


def test_a_discard_acts_on_the_whole_transaction_and_a_later_commit_publishes_every_part(shards, clock):
    a, b, c = shards("a"), shards("b"), shards("c")
    gid = half(a, begin=True, participants=("b",), body=b"a1").transaction_id
    pa = half(a, gid=gid, body=b"a2")
    pb = half(b, gid=gid, body=b"b1")
    half(c, gid=gid, body=b"c1")  # c is not named: it learns about G by asking
    clock.ms += int(a.config.max_transaction_lifetime_seconds * 1000) + 1
    assert list(a.db.call(a.claim_op(["pg"], 100, 10.0))) == []  # spent: discarded, not checked
    # the discard of G discards its parts on the coordinator in the same batch ...
    assert a.get_txn(gid).state == STATE_DISCARDED and a.get_txn(pa.transaction_id).state == STATE_DISCARDED
    assert discarded(a) == [b"a1", b"a2"] and visible(a) == []
    assert a.counters["pg"] == [0, 2]
    assert b.global_stats().parts_prepared == 1 and b.global_stats().oldest_prepared_part_ms > 0
    stats = a.global_stats()
    assert (stats.open, stats.pushes_pending, stats.parts_prepared, stats.parts_discarded) == (1, 1, 0, 1)
    # ... and is pushed to every named participant, which discards its parts on its own shard
    assert a.pushes() == [(gid, STATE_DISCARDED, codec.SOURCE_BROKER, ["b"])]
    a2 = BrokerCore(a.config, clock=clock, db=a.db)  # a new term finds the push in the store
    assert a2.pushes() == a.pushes()
    assert b.db.call(b.apply_global_op(gid, STATE_DISCARDED, codec.SOURCE_BROKER, "pg")) == 1
    assert b.get_txn(pb.transaction_id).state == STATE_DISCARDED and discarded(b) == [b"b1"]
    assert b.due_pulls(clock() + 10**9) == []  # told: it stops asking, the decision will be pushed
    assert (b.global_stats().parts_prepared, b.global_stats().parts_discarded) == (0, 1)
    a.db.call(a.push_done_op(gid, "b", STATE_DISCARDED))
    assert a.pushes() == []
    # a participant G did not name asks: it becomes a participant, and the answer ends its retries
    assert c.due_pulls(clock()) == [gid]
    row = a.db.call(a.resolve_global_op(gid, "c"))
    assert row.state == STATE_DISCARDED
    c.db.call(c.apply_global_op(gid, row.state, row.source, row.producer_group))
    assert discarded(c) == [b"c1"] and c.due_pulls(clock() + 10**9) == []
    late = half(c, gid=gid, body=b"c2")  # a part stored after the discard: it asks, and is discarded too
    clock.ms += 6_000
    assert c.due_pulls(clock()) == [gid]
    row = a.db.call(a.resolve_global_op(gid, "c"))
    assert c.db.call(c.apply_global_op(gid, row.state, row.source, row.producer_group)) == 1
    assert c.get_txn(late.transaction_id).state == STATE_DISCARDED and c.due_pulls(clock() + 10**9) == []
    b.close()
    b = BrokerCore(b.config, clock=clock)  # a restarted participant does not ask about discarded parts
    assert b.due_pulls(clock() + 10**9) == []
    # a part still refuses a decision of its own; a discarded G takes no new part
    with pytest.raises(InvalidFieldError, match="part of global transaction"):
        b.db.call(b.end_op(pb.transaction_id, "COMMIT", codec.SOURCE_OPERATOR, operator="ops"))
    with pytest.raises(TransactionStateError, match="DISCARDED"):
        half(a, gid=gid)
    # the operator commits G: every part on every shard, pushed to every participant again
    a.db.call(a.end_op(gid, "COMMIT", codec.SOURCE_OPERATOR, operator="ops"))
    assert visible(a) == [b"a1", b"a2"] and a.counters["pg"] == [0, 0]
    assert a.pushes() == [(gid, STATE_COMMITTED, codec.SOURCE_OPERATOR, ["b", "c"])]
    a.db.call(a.push_done_op(gid, "b", STATE_DISCARDED))  # a late acknowledgement of the discard
    assert a.pushes() == [(gid, STATE_COMMITTED, codec.SOURCE_OPERATOR, ["b", "c"])]
    for p, n in ((b, 1), (c, 2)):
        assert p.db.call(p.apply_global_op(gid, STATE_COMMITTED, codec.SOURCE_OPERATOR, "pg")) == n
        a.db.call(a.push_done_op(gid, p.name, STATE_COMMITTED))
        assert p.counters["pg"] == [0, 0] and p.global_problems() == []
    assert visible(b) == [b"b1"] and visible(c) == [b"c1", b"c2"]
    assert a.pushes() == [] and a.global_problems() == [] and live_rows(a) == []
    b.close()


def test_a_participant_told_of_the_discard_after_the_decision_keeps_its_parts_decided(shards, clock):
    a, b = shards("a"), shards("b")
    gid = half(a, begin=True, participants=("b",)).transaction_id
    pb = half(b, gid=gid, body=b"b1")
    clock.ms += int(a.config.max_transaction_lifetime_seconds * 1000) + 1
    a.db.call(a.claim_op(["pg"], 100, 10.0))
    a.db.call(a.end_op(gid, "ROLLBACK", codec.SOURCE_OPERATOR, operator="ops"))
    assert b.db.call(b.apply_global_op(gid, STATE_ROLLED_BACK, codec.SOURCE_OPERATOR, "pg")) == 1
    assert b.db.call(b.apply_global_op(gid, STATE_DISCARDED, codec.SOURCE_BROKER, "pg")) == 0  # late: nothing
    assert b.get_txn(pb.transaction_id).state == STATE_ROLLED_BACK and discarded(b) == []


def test_global_describe_lists_every_part_decided_or_not_until_retention(shards, clock):
    a, b = shards("a"), shards("b")
    gid = half(a, begin=True, participants=("b",)).transaction_id
    pa = half(a, gid=gid)
    p1, p2 = half(b, gid=gid), half(b, gid=gid)
    assert [p.seq for p in b.describe_global(gid)[3]] == [b.parse_txn_id(p1.transaction_id),
                                                        b.parse_txn_id(p2.transaction_id)]
    a.db.call(a.end_op(gid, "COMMIT", codec.SOURCE_CLIENT))
    b.db.call(b.apply_global_op(gid, STATE_COMMITTED, codec.SOURCE_CLIENT, "pg"))
    row, participants, pending, parts = a.describe_global(gid)
    assert row.state == STATE_COMMITTED and participants == ["b"] and pending == ["b"]
    assert [(p.seq, p.state) for p in parts] == [(a.parse_txn_id(pa.transaction_id), STATE_COMMITTED)]
    assert [p.state for p in b.describe_global(gid)[3]] == [STATE_COMMITTED, STATE_COMMITTED]
    # retention removes a part's index row with its transaction row (the newest entry of a
    # queue stays: it carries the next offset)
    clock.ms += int(b.config.retention_seconds * 1000) + 1
    b.db.call(b.retention_op())
    assert [p.seq for p in b.describe_global(gid)[3]] == [b.parse_txn_id(p2.transaction_id)]
    assert len([k for k, _ in b.db.scan("global")]) == 1 and b.global_problems() == []
