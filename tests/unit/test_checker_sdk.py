"""The SDK's side of checks without a cluster: what check_local_transaction's return values
become on the wire, and the message it receives."""

from __future__ import annotations

import pytest

import txmq
from txmq._checks import answer_for, check_message
from txmq.v1 import checker_pb2, common_pb2


@pytest.mark.parametrize("outcome, wire", [
    (txmq.LocalTransactionState.COMMIT, (common_pb2.CHECK_RESULT_COMMIT, 0.0)),
    (txmq.LocalTransactionState.ROLLBACK, (common_pb2.CHECK_RESULT_ROLLBACK, 0.0)),
    (txmq.LocalTransactionState.UNKNOWN, (common_pb2.CHECK_RESULT_UNKNOWN, 0.0)),
    (None, (common_pb2.CHECK_RESULT_UNKNOWN, 0.0)),
    ("COMMIT", (common_pb2.CHECK_RESULT_UNKNOWN, 0.0)),  # not the enum: UNKNOWN, never a guess
    (txmq.InProgress(retry_after_seconds=2.5), (common_pb2.CHECK_RESULT_IN_PROGRESS, 2.5)),
])
def test_answers(outcome, wire):
    assert answer_for(outcome) == wire


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), "5"])
def test_in_progress_needs_a_positive_retry_after(bad):
    with pytest.raises(txmq.InvalidFieldError):
        txmq.InProgress(retry_after_seconds=bad)


def test_the_listener_gets_a_transaction_message_with_the_attempt():
    check = checker_pb2.CheckRequest(
        check_id="c1", transaction_id="T1", attempt=2, broker_name="broker-0",
        message=common_pb2.Message(topic="orders", body=b"b", tag="A", keys=["k"], properties={"p": "1"},
                                   message_id="M1", queue_id=3))
    message = check_message(check, "checker-0")
    assert isinstance(message, txmq.TransactionMessage) and isinstance(message, txmq.CheckMessage)
    assert (message.transaction_id, message.message_id, message.broker_name, message.queue_id) == (
        "T1", "M1", "broker-0", 3)
    assert (message.topic, message.body, message.tag, message.keys, dict(message.properties)) == (
        "orders", b"b", "A", ("k",), {"p": "1"})
    assert message.attempt == 2 and message.checker_name == "checker-0"


def test_producer_options_are_validated():
    class L(txmq.TransactionListener):
        def execute_local_transaction(self, message, arg):
            return txmq.LocalTransactionState.COMMIT

        def check_local_transaction(self, message):
            return txmq.LocalTransactionState.COMMIT

    for options in ({"check_threads": 0}, {"checker_refresh_seconds": 0}, {"client_id": "x" * 256}):
        with pytest.raises(txmq.InvalidFieldError):
            txmq.TransactionProducer("127.0.0.1:1", producer_group="g", listener=L(), **options)
    with txmq.TransactionProducer("127.0.0.1:1", producer_group="g", listener=L(), answer_checks=False) as p:
        assert p.connected_checkers() == []
