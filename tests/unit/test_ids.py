from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from txmq.errors import InvalidIdError
from txmq.ids import MessageId, ReceiptHandle, TransactionId

brokers = st.text(min_size=1, max_size=60).filter(lambda s: len(s.encode()) <= 255)


@given(brokers, st.integers(0, 2**32 - 1))
def test_message_id_round_trip(broker: str, queue_id: int) -> None:
    mid = MessageId.new(broker, queue_id)
    assert MessageId.decode(mid.encode()) == mid


@given(brokers, st.integers(0, 2**32 - 1), st.integers(0, 2**64 - 1))
def test_transaction_id_round_trip(broker: str, store_id: int, seq: int) -> None:
    tid = TransactionId(broker, store_id, seq)
    assert TransactionId.decode(tid.encode()) == tid


@given(brokers, st.integers(0, 2**32 - 1), st.from_regex(r"[%a-zA-Z0-9_-]{1,127}", fullmatch=True),
       st.integers(0, 2**32 - 1), st.integers(0, 2**64 - 1), st.integers(0, 2**32 - 1), st.integers(0, 2**64 - 1))
def test_receipt_handle_round_trip(broker: str, store: int, topic: str, q: int, off: int, attempt: int,
                                   epoch: int) -> None:
    handle = ReceiptHandle(broker, store, topic, q, off, attempt, epoch)
    assert ReceiptHandle.decode(handle.encode()) == handle


def test_a_receipt_handle_without_an_epoch_reads_as_before() -> None:
    """Handles of unreplicated brokers (and those issued before epochs) keep their bytes."""
    plain = ReceiptHandle("broker-0", 7, "orders", 1, 42, 3)
    assert plain.epoch == 0
    # The encoding of the fields before the epoch existed (pinned: handles in flight at an upgrade).
    assert plain.encode() == "RAQhicm9rZXItMAAAAAcAAAABAAAAAAAAACoAAAADBm9yZGVyc9jN8bE"
    with_epoch = ReceiptHandle("broker-0", 7, "orders", 1, 42, 3, 19)
    assert with_epoch.encode() != plain.encode()
    assert ReceiptHandle.decode(with_epoch.encode()).epoch == 19


def test_ids_are_url_safe_text() -> None:
    text = TransactionId("broker-0", 7, 123).encode()
    assert text.startswith("T") and all(c.isalnum() or c in "-_" for c in text)


@pytest.mark.parametrize("mangle", [
    lambda s: s[:-1],                       # truncated
    lambda s: s[:5] + ("A" if s[5] != "A" else "B") + s[6:],   # one character changed
    lambda s: "M" + s[1:],                  # wrong kind
    lambda s: "T!!!",                       # not base64
    lambda s: "",
])
def test_mangled_transaction_ids_are_refused(mangle) -> None:
    text = TransactionId("broker-0", 7, 123).encode()
    with pytest.raises(InvalidIdError):
        TransactionId.decode(mangle(text))


def test_kinds_do_not_mix() -> None:
    with pytest.raises(InvalidIdError, match="does not start with 'R'"):
        ReceiptHandle.decode(TransactionId("b", 1, 2).encode())
