"""Round trips of every stored layout, and corruption detection."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.broker.store import codec
from services.broker.store.codec import CorruptRecordError, CqEntry, LogRecord, TxnRow

text = st.text(max_size=40)  # includes non-ASCII
names = st.from_regex(r"[%|a-zA-Z0-9_-]{1,127}", fullmatch=True)


@st.composite
def log_records(draw: st.DrawFn) -> LogRecord:
    return LogRecord(
        kind=draw(st.sampled_from([codec.KIND_NORMAL, codec.KIND_HALF])),
        topic=draw(names), body=draw(st.binary(max_size=2048)), message_id=draw(text),
        queue_id=draw(st.integers(0, 2**31 - 1)), stored_ms=draw(st.integers(0, 2**62)),
        queue_offset=draw(st.integers(-1, 2**62)), tag=draw(text),
        keys=tuple(draw(st.lists(text, max_size=5))),
        properties=draw(st.dictionaries(text, st.text(max_size=200), max_size=8)),
        producer_group=draw(text), producer_client_id=draw(text),
        check_immunity_seconds=draw(st.floats(0, 1e6)), born_ms=draw(st.integers(-2**62, 2**62)),
        born_host=draw(text), deliver_at_ms=draw(st.sampled_from([0, 1, 2**62])))


@given(log_records())
@settings(max_examples=200)
def test_log_record_round_trip(record: LogRecord) -> None:
    value = codec.encode_log_record(record)
    assert codec.decode_log_record(value) == record
    assert codec.decode_log_tag(value) == record.tag
    assert codec.decode_log_visibility(value) == (record.tag, record.deliver_at_ms)


def test_a_record_without_a_delivery_time_has_no_trailer() -> None:
    plain = LogRecord(kind=codec.KIND_NORMAL, topic="t", body=b"b", message_id="m", queue_id=0, stored_ms=1)
    timed = LogRecord(kind=codec.KIND_NORMAL, topic="t", body=b"b", message_id="m", queue_id=0, stored_ms=1,
                      deliver_at_ms=1234)
    assert len(codec.encode_log_record(timed)) == len(codec.encode_log_record(plain)) + 8
    # A trailer of another size, or a non-positive time, is corruption.
    payload = codec.unframe(codec.encode_log_record(plain))
    for tail in (b"\x00" * 4, (0).to_bytes(8, "big"), b"\x00" * 9):
        with pytest.raises(CorruptRecordError):
            codec.decode_log_record(codec.frame(payload + tail))
        with pytest.raises(CorruptRecordError):
            codec.decode_log_visibility(codec.frame(payload + tail))


def test_timer_keys_sort_by_due_time() -> None:
    keys = [codec.timer_key(t, s) for t, s in ((5, 9), (5, 10), (6, 1), (2**40, 0))]
    assert keys == sorted(keys)
    assert codec.split_timer_key(codec.timer_key(77, 3)) == (77, 3)


def test_log_record_with_max_body_round_trips() -> None:
    record = LogRecord(kind=codec.KIND_NORMAL, topic="t", body=b"\xff" * (4 * 1024 * 1024),
                       message_id="m", queue_id=0, stored_ms=1, properties={"ключ": "значение" * 100})
    assert codec.decode_log_record(codec.encode_log_record(record)) == record


@st.composite
def txn_rows(draw: st.DrawFn) -> TxnRow:
    return TxnRow(
        seq=draw(st.integers(0, 2**63)), state=draw(st.integers(1, 4)), producer_group=draw(text),
        producer_client_id=draw(text), topic=draw(names), queue_id=draw(st.integers(0, 2**31 - 1)),
        message_id=draw(text), prepared_ms=draw(st.integers(0, 2**62)), next_due_ms=draw(st.integers(0, 2**62)),
        body_size=draw(st.integers(0, 2**40)), source=draw(st.integers(0, 4)), ended_ms=draw(st.integers(0, 2**62)),
        queue_offset=draw(st.integers(-1, 2**62)), checks_delivered=draw(st.integers(0, 65535)),
        checks_answered=draw(st.integers(0, 65535)), discarded_ms=draw(st.integers(0, 2**62)),
        discard_reason=draw(text), operator=draw(text), reason=draw(text), claim_token=draw(text),
        unknown_answers=draw(st.integers(0, 65535)), in_progress_until_ms=draw(st.integers(0, 2**62)))


@given(txn_rows())
@settings(max_examples=200)
def test_txn_row_round_trip(row: TxnRow) -> None:
    assert codec.decode_txn(codec.encode_txn(row)) == row


@given(st.integers(0, 2**63), st.integers(-2**62, 2**62), text)
def test_cq_entry_round_trip(seq: int, visible: int, tag: str) -> None:
    entry = CqEntry(seq, visible, tag)
    assert codec.decode_cq_entry(codec.encode_cq_entry(entry)) == entry


@given(names, st.integers(0, 2**32 - 1), st.integers(0, 2**64 - 1))
def test_cq_keys_split_and_sort_by_offset(topic: str, queue_id: int, offset: int) -> None:
    key = codec.cq_key(topic, queue_id, offset)
    assert codec.split_cq_key(key) == (topic, queue_id, offset)
    if offset < 2**64 - 1:
        assert key < codec.cq_key(topic, queue_id, offset + 1)
    assert key.startswith(codec.queue_prefix(topic, queue_id))


@given(names, st.integers(0, 2**63), st.integers(0, 2**63))
def test_due_keys_sort_by_time_within_a_group(group: str, t: int, seq: int) -> None:
    key = codec.group_time_key(group, t, seq)
    assert codec.split_group_time_key(key) == (group, t, seq)
    assert key < codec.group_time_key(group, t + 1, 0)
    assert key.startswith(codec.group_prefix(group))


def test_every_flipped_byte_is_detected() -> None:
    value = codec.encode_log_record(LogRecord(kind=codec.KIND_HALF, topic="orders", body=b"payload",
                                              message_id="m1", queue_id=3, stored_ms=42, tag="A"))
    for i in range(len(value)):
        broken = bytearray(value)
        broken[i] ^= 0x40
        with pytest.raises(CorruptRecordError):
            codec.decode_log_record(bytes(broken), b"k")
        with pytest.raises(CorruptRecordError):
            codec.decode_log_tag(bytes(broken), b"k")


def test_torn_record_is_detected() -> None:
    value = codec.encode_txn(TxnRow(seq=1, state=1, producer_group="g", producer_client_id="c", topic="t",
                                    queue_id=0, message_id="m", prepared_ms=1, next_due_ms=2, body_size=3))
    for cut in range(len(value)):
        with pytest.raises(CorruptRecordError):
            codec.decode_txn(value[:cut])


def test_unknown_version_is_reported() -> None:
    value = bytearray(codec.encode_counters(1, 2))
    value[0] = 9
    with pytest.raises(CorruptRecordError, match="unknown version 9"):
        codec.decode_counters(bytes(value))


def test_an_in_flight_row_carries_its_delivery_epoch_only_when_set() -> None:
    """Rows written before epochs (and every row of an unreplicated broker) read as epoch 0."""
    assert codec.encode_inflight(3, 1234) == codec.frame(struct.pack(">Iq", 3, 1234))
    assert codec.decode_inflight(codec.encode_inflight(3, 1234)) == (3, 1234, 0)
    assert codec.decode_inflight(codec.encode_inflight(3, 1234, 77)) == (3, 1234, 77)
