"""Finding messages (issue 32, item 2) against real processes: by message id (a normal
message, a delayed one, a committed and a pending transactional one), by key (the key
index: committed messages only; a half message is found by ``txn list --key``), by queue
and offset; ``txmq message get|find|print`` and ``txmq txn describe MESSAGE_ID``; bad input
refused naming the field."""

from __future__ import annotations

import json

import pytest

import txmq
import txmq.ids
from tests.support.cli import txmq_cli
from tests.support.waiting import wait_until
from txmq.v1 import common_pb2

LocalState = txmq.LocalTransactionState


class Decide(txmq.TransactionListener):
    def execute_local_transaction(self, message, arg):
        return arg

    def check_local_transaction(self, message):
        return LocalState.UNKNOWN


def test_by_id_key_and_offset(cluster, unique_name) -> None:
    topic, group = unique_name("find"), unique_name("pg")
    cluster.create_topic(topic, queue_count=2)
    with txmq.Producer(cluster.nameserver_address) as p:
        plain = p.send(txmq.Message(topic, b"plain", keys=("order-1",), tag="created"))
        later = p.send(txmq.Message(topic, b"later", keys=("order-1",), delay_seconds=600))
    with txmq.TransactionProducer(cluster.nameserver_address, producer_group=group, listener=Decide()) as tp:
        committed = tp.send_in_transaction(txmq.Message(topic, b"committed", keys=("order-1", "pay-9")),
                                           LocalState.COMMIT)
        pending = tp.send_in_transaction(txmq.Message(topic, b"pending", keys=("order-1",)), LocalState.UNKNOWN)
    with txmq.Admin(cluster.nameserver_address) as admin:
        got = admin.get_message(plain.message_id)
        assert got.message.message.body == b"plain" and got.message.queue_offset == plain.queue_offset
        assert got.transaction_state == common_pb2.TRANSACTION_STATE_UNSPECIFIED and not got.scheduled
        got = admin.get_message(later.message_id)
        assert got.scheduled and got.message.queue_offset == -1
        got = admin.get_message(committed.message_id)
        assert got.transaction_state == common_pb2.TRANSACTION_STATE_COMMITTED and got.message.queue_offset >= 0
        assert got.message.transaction_id == committed.transaction_id
        got = admin.get_message(pending.message_id)
        assert got.transaction_state == common_pb2.TRANSACTION_STATE_PREPARED and got.message.queue_offset == -1

        found = admin.find_messages(topic, "order-1")
        # The committed ones in their queues; the delayed one is not in its queue yet, the
        # pending half message is for the txn tools.
        assert sorted(m.message.message.body for m in found.messages) == [b"committed", b"plain"]
        assert [m.message.message.body for m in admin.find_messages(topic, "pay-9").messages] == [b"committed"]
        assert admin.find_messages(topic, "order-").messages == []  # exact keys, not prefixes
        assert len(admin.find_messages(topic, "order-1", limit=1).messages) == 1
        assert admin.find_messages(topic, "order-1", limit=1).truncated

        read = admin.read_messages(topic, plain.queue_id, plain.queue_offset, broker=plain.broker_name)
        assert [m.message.message.body for m in read.messages] == [b"plain"]
        assert read.max_offset > read.min_offset

        for call, field in [(lambda: admin.find_messages(topic, ""), "key"),
                            (lambda: admin.find_messages(topic, "k", limit=5000), "limit"),
                            (lambda: admin.get_message(""), "message_id"),
                            (lambda: admin.read_messages(topic, 0, -1), "offset")]:
            with pytest.raises(txmq.InvalidArgumentError) as refused:
                call()
            assert refused.value.details.get("field") == field
        with pytest.raises(txmq.QueueNotFoundError):
            admin.read_messages(topic, 9, 0)
        with pytest.raises(txmq.NotFoundError):
            admin.get_message(txmq.ids.MessageId.new("broker-0", 0).encode())

    # The CLI: message get / find / print, txn describe by message id, txn list --key.
    done = txmq_cli(cluster, "message", "get", plain.message_id)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["body_utf8"] == "plain" and data["keys"] == ["order-1"] and data["transaction_id"] is None
    done = txmq_cli(cluster, "message", "find", topic, "--key", "order-1", "--since", "1h ago")
    assert sorted(m["body_utf8"] for m in json.loads(done.stdout)["messages"]) == ["committed", "plain"]
    done = txmq_cli(cluster, "message", "print", topic, "--queue", str(plain.queue_id), "--offset",
                    str(plain.queue_offset), "--broker", plain.broker_name)
    assert [m["body_utf8"] for m in json.loads(done.stdout)["messages"]] == ["plain"]
    done = txmq_cli(cluster, "txn", "describe", pending.message_id)
    assert done.returncode == 0, done.stderr
    described = json.loads(done.stdout)
    assert described["transaction_id"] == pending.transaction_id and described["state"] == "pending"
    done = txmq_cli(cluster, "txn", "describe", plain.message_id)
    assert done.returncode == 1 and "not transactional" in json.loads(done.stderr)["error"]["message"]
    done = txmq_cli(cluster, "txn", "list", "--group", group, "--key", "order-1", "--state", "pending")
    assert [t["transaction_id"] for t in json.loads(done.stdout)["transactions"]] == [pending.transaction_id]
    done = txmq_cli(cluster, "message", "find", topic)
    assert done.returncode == 2


def test_a_committed_transaction_is_found_by_key_once_committed(cluster, unique_name) -> None:
    topic, group = unique_name("late"), unique_name("pg")
    cluster.create_topic(topic, queue_count=1)
    with txmq.TransactionProducer(cluster.nameserver_address, producer_group=group, listener=Decide()) as tp, \
            txmq.Admin(cluster.nameserver_address) as admin:
        sent = tp.send_in_transaction(txmq.Message(topic, b"x", keys=("k-late",)), LocalState.UNKNOWN)
        assert admin.find_messages(topic, "k-late").messages == []
        admin.resolve_transaction(sent.transaction_id, "commit", operator="ops", reason="paid")
        found = wait_until(lambda: admin.find_messages(topic, "k-late").messages, 10)
        assert [m.message.transaction_id for m in found] == [sent.transaction_id]
