"""Ids a client did not receive are refused: the id codecs raise the id error for every
input (fuzzed with hypothesis: any text, and any bytes behind a valid kind letter and CRC),
and the broker's id authority (services/broker/idauth.py) refuses minted, altered and
foreign ids before any lookup, accepts old untagged ids only for what existed before its
secret, and keeps one secret per store across reopening."""

from __future__ import annotations

import base64
import dataclasses
import struct
import zlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.broker import idauth
from services.broker.config import BrokerConfig
from services.broker.core import BrokerCore, parse_tag_filter
from services.broker.store import codec
from services.broker.store.codec import LogRecord
from txmq.errors import InvalidIdError, ReceiptHandleNotFoundError, WrongBrokerError
from txmq.ids import MessageId, ReceiptHandle, TransactionId
from tests.support.clock import Clock

CODECS = (MessageId, TransactionId, ReceiptHandle)


def checksummed(kind: str, raw: bytes) -> str:
    """An id text of ``kind`` whose CRC is right over arbitrary bytes (what a forger makes)."""
    raw += struct.pack(">I", zlib.crc32(raw))
    return kind + base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def decodes_or_refuses(codec_cls: Any, text: Any) -> None:
    try:
        codec_cls.decode(text)
    except InvalidIdError:
        pass  # any other exception fails the test (it was an INTERNAL on the wire)


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(CODECS), st.text(max_size=300))
def test_every_text_decodes_or_is_an_id_error(codec_cls: Any, text: str) -> None:
    decodes_or_refuses(codec_cls, text)
    decodes_or_refuses(codec_cls, codec_cls.KIND + text)


@settings(max_examples=1500, deadline=None)
@given(st.sampled_from(CODECS), st.integers(0, 3), st.binary(max_size=1), st.binary(max_size=120))
def test_every_checksummed_byte_string_decodes_or_is_an_id_error(codec_cls: Any, version: int, name_len: bytes,
                                                                 rest: bytes) -> None:
    """Past the CRC, the structure: versions, name lengths, payloads, topics of any bytes."""
    raw = bytes([version]) + (name_len or bytes([len(rest) % 40])) + rest
    decodes_or_refuses(codec_cls, checksummed(codec_cls.KIND, raw))


@pytest.mark.parametrize("value", [None, 7, b"R", ["R"], "R" + "A" * 5000])
def test_non_strings_and_huge_strings_are_id_errors(value: Any) -> None:
    for codec_cls in CODECS:
        with pytest.raises(InvalidIdError):
            codec_cls.decode(value)


def test_a_receipt_handle_whose_topic_is_not_utf8_is_an_id_error() -> None:
    """The census's INTERNAL: a valid checksum over a topic of invalid UTF-8."""
    good = ReceiptHandle("broker-0", 7, "orders", 1, 42, 3)
    raw = base64.urlsafe_b64decode(good.encode()[1:] + "==")[:-4]
    text = checksummed("R", raw.replace(b"orders", b"\xff\xfe\xfdder"))
    with pytest.raises(InvalidIdError, match="topic is not UTF-8"):
        ReceiptHandle.decode(text)


def test_ids_have_one_text() -> None:
    """A second spelling of the same bytes (padding, ignored characters) is refused."""
    text = TransactionId("broker-0", 7, 123).encode()
    for other in (text + "=", text[:3] + "!" + text[3:], text[:3] + "\n" + text[3:]):
        with pytest.raises(InvalidIdError):
            TransactionId.decode(other)


def test_tagged_ids_round_trip_and_stay_routable() -> None:
    tid = TransactionId("broker-7", 9, 5, b"\x01" * 16)
    assert TransactionId.decode(tid.encode()) == tid and TransactionId.decode(tid.encode()).broker == "broker-7"
    handle = ReceiptHandle("broker-7", 9, "orders", 1, 2, 3, 4, b"\x02" * 16)
    assert ReceiptHandle.decode(handle.encode()) == handle
    with pytest.raises(InvalidIdError):
        MessageId.decode(checksummed("M", base64.urlsafe_b64decode(tid.encode()[1:] + "==")[:-4]))


# --------------------------------------------------------------------------- the authority
@pytest.fixture
def open_core(tmp_path: Any) -> Any:
    cores: list[BrokerCore] = []
    clock = Clock()

    def make() -> BrokerCore:
        for c in cores:
            c.close()
        cores.clear()
        core = BrokerCore(BrokerConfig(data_dir=str(tmp_path / "store"), broker_name="broker-0", flush="async"),
                          clock=clock)
        cores.append(core)
        return core

    yield make
    for c in cores:
        c.close()


def half(core: BrokerCore, group: str = "pg") -> Any:
    record = core.validate_message(LogRecord(kind=codec.KIND_HALF, topic="orders", body=b"b", message_id="",
                                             queue_id=0, stored_ms=0, producer_group=group))
    return core.db.call(core.send_op(record))


def deliver(core: BrokerCore, group: str) -> Any:
    return core.db.call(core.receive_op(group, "orders", -1, parse_tag_filter("*"), 16, 60.0)).deliveries


def test_issued_ids_verify_and_minted_or_altered_ones_do_not(open_core: Any) -> None:
    core = open_core()
    core.db.call(core.create_topic_op("orders", 1))
    sent = half(core)
    seq = core.parse_txn_id(sent.transaction_id)
    issued = TransactionId.decode(sent.transaction_id)
    assert len(issued.tag) == idauth.TAG_BYTES
    for forged, why in [
        (TransactionId(core.name, core.store_id, seq + 1), "carries no authenticator"),       # counted up
        (TransactionId(core.name, core.store_id, seq + 1, issued.tag), "mismatch"),          # tag moved over
        (TransactionId(core.name, core.store_id, seq, bytes(16)), "mismatch"),               # tag made up
    ]:
        with pytest.raises(InvalidIdError, match=why):
            core.parse_txn_id(forged.encode())
    with pytest.raises(InvalidIdError, match="earlier store"):
        core.parse_txn_id(TransactionId(core.name, core.store_id + 1, seq, issued.tag).encode())
    with pytest.raises(WrongBrokerError):
        core.parse_txn_id(TransactionId("broker-1", core.store_id, seq, issued.tag).encode())
    # A page token is a cursor: read without its MAC (the pipeline makes them from sequences).
    assert core.parse_txn_id(TransactionId(core.name, core.store_id, 5).encode(), cursor=True) == 5


def test_receipt_handles_are_good_only_for_their_group_and_delivery(open_core: Any) -> None:
    core = open_core()
    core.db.call(core.create_topic_op("orders", 1))
    core.db.call(core.end_op(half(core).transaction_id, "COMMIT", codec.SOURCE_CLIENT))
    (mine,) = deliver(core, "ca")
    (theirs,) = deliver(core, "cb")  # the same message, delivered to another group
    assert core.parse_receipt(mine.receipt_handle, "ca").offset == 0
    with pytest.raises(InvalidIdError, match="consumer group 'ca'"):  # a captured handle of another group
        core.parse_receipt(theirs.receipt_handle, "ca")
    decoded = ReceiptHandle.decode(mine.receipt_handle)
    for field, value in [("offset", 1), ("attempt", 2), ("topic", "other"), ("queue_id", 1)]:
        altered = dataclasses.replace(decoded, **{field: value})
        with pytest.raises(InvalidIdError, match="mismatch"):
            core.parse_receipt(altered.encode(), "ca")
    with pytest.raises(InvalidIdError, match="no authenticator"):
        core.parse_receipt(dataclasses.replace(decoded, tag=b"").encode(), "ca")
    with pytest.raises(ReceiptHandleNotFoundError):  # an earlier store's
        core.parse_receipt(dataclasses.replace(decoded, store_id=decoded.store_id + 1).encode(), "ca")


def test_the_secret_is_the_stores_and_survives_reopening(open_core: Any) -> None:
    core = open_core()
    core.db.call(core.create_topic_op("orders", 1))
    sent = half(core)
    secret = core.ids.secret
    core = open_core()
    assert core.ids.secret == secret
    assert core.parse_txn_id(sent.transaction_id) == 1
    assert core.db.get("meta", idauth.SECRET_KEY) is not None


def test_a_store_from_before_the_secret_keeps_its_old_ids_and_only_those(open_core: Any) -> None:
    """An upgrade: the store's transactions and in-flight deliveries from before keep their
    untagged ids; nothing made afterwards is accepted untagged."""
    core = open_core()
    core.db.call(core.create_topic_op("orders", 1))
    old_txn = half(core)
    committed = half(core)
    core.db.call(core.end_op(committed.transaction_id, "COMMIT", codec.SOURCE_CLIENT))
    (delivery,) = deliver(core, "cg")
    # As a store written before ids were authenticated: no secret, untagged ids out there.
    core.db.call(lambda w: (w.delete("meta", idauth.SECRET_KEY), w.delete("meta", idauth.LEGACY_RECEIPTS_KEY)))
    old_seq = core.parse_txn_id(old_txn.transaction_id)
    old_id = TransactionId(core.name, core.store_id, old_seq).encode()
    old_handle = dataclasses.replace(ReceiptHandle.decode(delivery.receipt_handle), tag=b"").encode()
    core = open_core()  # the upgraded broker starts: a secret now
    assert core.ids.secret is not None and core.ids.secret.legacy_below_seq == core.next_seq
    assert core.parse_txn_id(old_id) == old_seq
    assert core.db.call(core.end_op(old_id, "ROLLBACK", codec.SOURCE_CLIENT)).state == codec.STATE_ROLLED_BACK
    assert core.parse_receipt(old_handle, "cg").offset == delivery.offset
    with pytest.raises(InvalidIdError):  # the old handle was issued to cg, nobody else
        core.parse_receipt(old_handle, "other")
    new = half(core)
    with pytest.raises(InvalidIdError, match="no authenticator"):
        core.parse_txn_id(TransactionId(core.name, core.store_id, core.parse_txn_id(new.transaction_id)).encode())
    # Acknowledged: the old delivery is over, and its handle with it (after a restart too).
    assert core.db.call(core.ack_op("cg", "orders", [old_handle])) == [None]
    core = open_core()
    with pytest.raises(InvalidIdError):
        core.parse_receipt(old_handle, "cg")
    assert core.db.get("meta", idauth.LEGACY_RECEIPTS_KEY) is None


def test_legacy_receipt_records_round_trip() -> None:
    found = {("g", "t", 1, 2, 3, 4), ("é", "%DLQ%x", 0, 0, 1, 0)}
    assert idauth.decode_legacy(idauth.encode_legacy(found)) == found
    secret = idauth.IdSecret(b"k" * 32, 9, 10)
    assert idauth.decode_secret(idauth.encode_secret(secret)) == secret


def test_a_page_token_minted_from_a_sequence_continues_a_listing(open_core: Any) -> None:
    """The pipeline pages QueryTransactions with tokens it makes from sequences (untagged):
    a token is a cursor, not an id naming something the caller acts on."""
    core = open_core()
    core.db.call(core.create_topic_op("orders", 1))
    sent = [half(core) for _ in range(3)]
    first = core.parse_txn_id(sent[0].transaction_id)
    rows, _token = core.query_txns("", 0, 0, 10, TransactionId(core.name, core.store_id, first).encode())
    assert [core.txn_id(r.seq) for r in rows] == [s.transaction_id for s in sent[1:]]


def test_a_repeated_message_id_answers_only_its_own_sender(open_core: Any) -> None:
    """Deduplication tells a retry what its first send stored; another producer group's or
    topic's send under that id learns nothing (it would learn the other's transaction id)."""
    from txmq.errors import InvalidFieldError

    core = open_core()
    core.db.call(core.create_topic_op("orders", 1))
    core.db.call(core.create_topic_op("other", 1))
    first = half(core, group="pg")

    def again(topic: str, group: str, kind: int = codec.KIND_HALF) -> Any:
        record = core.validate_message(LogRecord(kind=kind, topic=topic, body=b"b", message_id=first.message_id,
                                                 queue_id=0, stored_ms=0, producer_group=group))
        return core.db.call(core.send_op(record))

    retry = again("orders", "pg")
    assert retry.duplicate and retry.transaction_id == first.transaction_id
    with pytest.raises(InvalidFieldError, match="another producer group"):
        again("orders", "intruder")
    with pytest.raises(InvalidFieldError, match="another topic"):
        again("other", "pg")
