"""Node.js clients: the official RocketMQ 5 client (rocketmq-client-nodejs, unmodified)
through the proxy, and a client generated at run time from protos/txmq/v1 (grpc-js +
proto-loader) against the native services. Installed by ``make proxy-deps``."""

from __future__ import annotations

from typing import Callable

import pytest

import txmq
from tests.support.cluster import Cluster
from tests.support.waiting import wait_until
from txmq.ids import TransactionId
from txmq.v1 import broker_pb2, broker_pb2_grpc, common_pb2

from .support import Clients, assert_delivered_at_their_time, node_ready

pytestmark = [pytest.mark.timeout(180),
              pytest.mark.skipif(node_ready() is not None, reason=node_ready() or "")]


def test_node_transactional_commit_and_rollback(rmq_cluster: Cluster, clients: Clients,
                                                unique_name: Callable[[str], str]) -> None:
    topic, group = unique_name("nodetx"), unique_name("g")
    proxy = rmq_cluster.proxy_addresses[0]
    producer = clients.node("rmq_node.js", "transactional", endpoints=proxy, topic=topic,
                            bodies=["commit-1", "rollback-1", "commit-2"])
    producer.expect_success(60)
    sent = {e["body"]: e for e in producer.of("sent")}
    assert set(sent) == {"commit-1", "rollback-1", "commit-2"}
    assert len({e["transaction_id"] for e in sent.values()}) == 3

    consumer = clients.node("rmq_node.js", "simple", endpoints=proxy, topic=topic, group=group, count=2,
                            await_seconds=1)
    consumer.expect_success(60)
    received = consumer.of("received")
    assert sorted(m["body"] for m in received) == ["commit-1", "commit-2"]
    for m in received:
        assert m["message_id"] == sent[m["body"]]["message_id"]
        assert m["tag"] == "TagA" and m["delivery_attempt"] == 1 and not m.get("corrupted")


def test_node_orphan_recovered_by_a_second_producer(rmq_cluster: Cluster, clients: Clients,
                                                    unique_name: Callable[[str], str]) -> None:
    """A first Node producer dies (SIGKILL) after its half message; a second Node producer,
    connected to the other proxy replica, gets RecoverOrphanedTransactionCommand, its
    checker commits through EndTransaction(SOURCE_SERVER_CHECK), and the message is
    consumed once."""
    topic = unique_name("nodeorphan")
    first = clients.node("rmq_node.js", "orphan", endpoints=rmq_cluster.proxy_addresses[0], topic=topic,
                         body="orphan-commit")
    sent = first.wait_event("sent", timeout=60)[0]
    assert first.finish(30, close_stdin=False) == -9  # killed before commit

    second = clients.node("rmq_node.js", "checker", endpoints=rmq_cluster.proxy_addresses[1], topic=topic)
    checked = second.wait_event("checked", timeout=60)[0]
    assert checked["message_id"] == sent["message_id"] and checked["resolution"] == "COMMIT"
    assert checked["body"] == "orphan-commit" and checked["topic"] == topic and not checked.get("corrupted")

    # Applied on the broker as the check's answer (the client's call goes to any replica).
    broker = TransactionId.decode(sent["transaction_id"]).broker
    address = next(b.address for b in rmq_cluster.list_brokers() if b.name == broker)
    stub = broker_pb2_grpc.BrokerServiceStub(rmq_cluster.channel(address))

    def committed() -> common_pb2.Transaction | None:
        txn = stub.GetTransaction(broker_pb2.GetTransactionRequest(transaction_id=sent["transaction_id"]),
                                  timeout=5).transaction
        return txn if txn.state == common_pb2.TRANSACTION_STATE_COMMITTED else None

    txn = wait_until(committed, 30, message="the orphan committed by the Node checker")
    assert txn.resolution_source == common_pb2.TRANSACTION_SOURCE_CHECK
    second.expect_success(60)

    # Consumed once: one delivery, then nothing more for the group.
    with txmq.SimpleConsumer(rmq_cluster.nameserver_address, consumer_group=unique_name("g"),
                             subscriptions={topic: "*"}, await_duration_seconds=1.0) as consumer:
        received = wait_until(lambda: consumer.receive(16, 10.0), 30, message="the committed orphan")
        assert [(m.message_id, m.body) for m in received] == [(sent["message_id"], b"orphan-commit")]
        consumer.ack(received[0])
        assert consumer.receive(16, 10.0) == []


def test_node_simple_consumer_change_invisibility(rmq_cluster: Cluster, clients: Clients,
                                                  unique_name: Callable[[str], str]) -> None:
    topic, group = unique_name("nodesimple"), unique_name("g")
    proxy = rmq_cluster.proxy_addresses[1]
    clients.python("send", endpoints=proxy, topic=topic, bodies=["plain-1", "postpone-1"]).expect_success(60)
    consumer = clients.node("rmq_node.js", "simple", endpoints=proxy, topic=topic, group=group, count=2,
                            await_seconds=1, invisible_seconds=20, postpone_seconds=1)
    consumer.expect_success(60)
    attempts = sorted((m["body"], m["delivery_attempt"]) for m in consumer.of("received"))
    assert attempts == [("plain-1", 1), ("postpone-1", 1), ("postpone-1", 2)]


def test_generated_node_client_on_the_native_protos(rmq_cluster: Cluster, clients: Clients,
                                                    unique_name: Callable[[str], str]) -> None:
    topic = unique_name("nodenative")
    client = clients.node("native_txmq.js", "flow", nameserver=rmq_cluster.nameserver_address, topic=topic,
                          group=unique_name("pg"), consumer_group=unique_name("g"), body="hello from js")
    client.expect_success(60)
    [sent] = client.of("sent")
    assert sent["state"] == "TRANSACTION_STATE_PREPARED"
    assert client.of("ended")[0]["state"] == "TRANSACTION_STATE_COMMITTED"
    [received] = client.of("received")
    assert received["body"] == "hello from js" and received["message_id"] == sent["message_id"]
    assert received["transaction_id"] == sent["transaction_id"] and received["delivery_attempt"] == 1
    assert received["properties"] == {"lang": "node"} and received["keys"] == ["js-key"]
    assert client.of("acked")[0]["code"] == 0
    # What the broker recorded, read back with the Python stubs.
    broker = TransactionId.decode(sent["transaction_id"]).broker
    address = next(b.address for b in rmq_cluster.list_brokers() if b.name == broker)
    txn = broker_pb2_grpc.BrokerServiceStub(rmq_cluster.channel(address)).GetTransaction(
        broker_pb2.GetTransactionRequest(transaction_id=sent["transaction_id"]), timeout=5).transaction
    assert txn.state == common_pb2.TRANSACTION_STATE_COMMITTED
    assert txn.resolution_source == common_pb2.TRANSACTION_SOURCE_CLIENT


def test_node_simple_consumer_with_a_sql92_filter(rmq_cluster: Cluster, clients: Clients,
                                                  unique_name: Callable[[str], str]) -> None:
    topic, group = unique_name("nodesql"), unique_name("g")
    proxy = rmq_cluster.proxy_addresses[1]
    clients.python("send", endpoints=proxy, topic=topic, bodies=[f"m{i}" for i in range(5)],
                   props={"region": "eu"}).expect_success(60)
    consumer = clients.node("rmq_node.js", "simple", endpoints=proxy, topic=topic, group=group, count=2,
                            await_seconds=1, sql=True, filter="n BETWEEN 1 AND 2 AND region IS NOT NULL")
    consumer.expect_success(60)
    assert sorted(m["body"] for m in consumer.of("received")) == ["m1", "m2"]


def test_node_delay_message_is_delivered_at_its_time(rmq_cluster: Cluster, clients: Clients,
                                                     unique_name: Callable[[str], str]) -> None:
    topic, group = unique_name("nodedelay"), unique_name("g")
    proxy = rmq_cluster.proxy_addresses[1]
    sender = clients.node("rmq_node.js", "send", endpoints=proxy, topic=topic, bodies=["d1", "d2"], delay_ms=2000)
    sender.expect_success(60)
    consumer = clients.node("rmq_node.js", "simple", endpoints=proxy, topic=topic, group=group, count=2,
                            await_seconds=1)
    consumer.expect_success(60)
    assert_delivered_at_their_time(sender, consumer)
