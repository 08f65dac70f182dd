"""The official RocketMQ 5 Python client (rocketmq-python-client, unmodified, in
subprocesses) against txmq through the proxy."""

from __future__ import annotations

import time
from typing import Callable

import pytest

import txmq
from txmq.ids import TransactionId
from txmq.v1 import broker_pb2, broker_pb2_grpc, common_pb2
from tests.support.cluster import Cluster
from tests.support.metrics import metric_sum
from tests.support.processes import ServiceProcess
from tests.support.waiting import wait_until

from .support import Clients, assert_delivered_at_their_time

pytestmark = pytest.mark.timeout(180)


def native_consumer(cluster: Cluster, group: str, topic: str) -> txmq.SimpleConsumer:
    return txmq.SimpleConsumer(cluster.nameserver_address, consumer_group=group, subscriptions={topic: "*"},
                               await_duration_seconds=1.0)


def test_transactional_commit_and_rollback(rmq_cluster: Cluster, clients: Clients,
                                           unique_name: Callable[[str], str]) -> None:
    topic, group = unique_name("tx"), unique_name("g")
    proxy = rmq_cluster.proxy_addresses[0]
    producer = clients.python("transactional", endpoints=proxy, topic=topic,
                              bodies=["commit-1", "rollback-1", "commit-2"])
    producer.expect_success(60)
    sent = {e["body"]: e for e in producer.of("sent")}
    assert set(sent) == {"commit-1", "rollback-1", "commit-2"}
    assert all(e["transaction_id"] for e in sent.values())
    assert len({e["transaction_id"] for e in sent.values()}) == 3

    consumer = clients.python("simple", endpoints=proxy, topic=topic, group=group, count=2, await_seconds=1)
    consumer.expect_success(60)
    received = consumer.of("received")
    assert sorted(m["body"] for m in received) == ["commit-1", "commit-2"]
    for m in received:
        assert m["message_id"] == sent[m["body"]]["message_id"]
        assert m["topic"] == topic and m["tag"] == "TagA" and m["delivery_attempt"] == 1
        assert not m["corrupted"]
    assert {m["properties"]["n"] for m in received} == {"0", "2"}


def receive_native(cluster: Cluster, group: str, topic: str, count: int, timeout: float = 30.0,
                   ack: bool = True) -> list[txmq.ReceivedMessage]:
    """Receives (and acknowledges) ``count`` messages with the native SDK."""
    out: list[txmq.ReceivedMessage] = []
    deadline = time.monotonic() + timeout
    with native_consumer(cluster, group, topic) as consumer:
        while len(out) < count and time.monotonic() < deadline:
            for m in consumer.receive(16, 10.0):
                out.append(m)
                if ack:
                    consumer.ack(m)
    assert len(out) >= count, f"received {len(out)} of {count} messages from {topic}"
    return out


def transaction_of(cluster: Cluster, transaction_id: str) -> object:
    broker = TransactionId.decode(transaction_id).broker
    address = next(b.address for b in cluster.list_brokers() if b.name == broker)
    stub = broker_pb2_grpc.BrokerServiceStub(cluster.channel(address))
    return stub.GetTransaction(broker_pb2.GetTransactionRequest(transaction_id=transaction_id), timeout=5).transaction


def test_orphan_recovered_by_a_second_producer_through_another_replica(
        rmq_cluster: Cluster, clients: Clients, unique_name: Callable[[str], str]) -> None:
    """The first producer dies after its half message (sent through proxy-0); the checker
    asks the second one (connected to proxy-1), whose TransactionChecker commits."""
    topic = unique_name("orphan")
    first = clients.python("orphan", endpoints=rmq_cluster.proxy_addresses[0], topic=topic, body="orphan-commit")
    sent = first.wait_event("sent", timeout=60)[0]
    assert first.finish(30, close_stdin=False) == -9  # killed before commit

    second = clients.python("checker", endpoints=rmq_cluster.proxy_addresses[1], topic=topic)
    checked = second.wait_event("checked", timeout=60)[0]
    assert checked["message_id"] == sent["message_id"]
    assert checked["body"] == "orphan-commit" and checked["topic"] == topic and not checked["corrupted"]

    # The answer travels on (client → proxy → broker, and the checker). The client stays up
    # until it is applied: the official client's shutdown can cancel its check thread's
    # EndTransaction before it leaves (test_replicas covers an answer whose caller gave up).
    txn = wait_until(lambda: (t := transaction_of(rmq_cluster, sent["transaction_id"])).state
                     == common_pb2.TRANSACTION_STATE_COMMITTED and t, 30,
                     message=lambda: f"not committed: {transaction_of(rmq_cluster, sent['transaction_id'])}")
    second.expect_success(60)
    assert txn.resolution_source == common_pb2.TRANSACTION_SOURCE_CHECK
    [m] = receive_native(rmq_cluster, unique_name("g"), topic, 1)
    assert m.body == b"orphan-commit" and m.message_id == sent["message_id"]
    # The proxy told the checker (answer and credit back), and nothing it sent was refused,
    # although the client may send its answer after its Telemetry stream ended (shutdown).
    port = rmq_cluster.checkers[0].metrics_port
    wait_until(lambda: metric_sum(port, "txmq_checks_total", {"group": topic, "result": "commit"}) >= 1, 10,
               message="the checker heard no answer from the proxy")
    assert metric_sum(port, "txmq_check_answers_refused_total", {"group": topic}) == 0


def test_simple_consumer_ack_and_change_invisibility(rmq_cluster: Cluster, clients: Clients,
                                                     unique_name: Callable[[str], str]) -> None:
    topic, group = unique_name("simple"), unique_name("g")
    proxy = rmq_cluster.proxy_addresses[0]
    clients.python("send", endpoints=proxy, topic=topic, bodies=["plain-1", "postpone-1"]).expect_success(60)
    consumer = clients.python("simple", endpoints=proxy, topic=topic, group=group, count=2, await_seconds=1,
                              invisible_seconds=20, postpone_seconds=1)
    consumer.expect_success(60)
    received = consumer.of("received")
    attempts = sorted((m["body"], m["delivery_attempt"]) for m in received)
    # The postponed message comes back after 1 s (not after its 20 s invisibility), as attempt 2.
    assert attempts == [("plain-1", 1), ("postpone-1", 1), ("postpone-1", 2)]
    assert len(consumer.of("acked")) == 2
    # Everything was acknowledged: the group has nothing left.
    again = clients.python("simple", endpoints=proxy, topic=topic, group=group, count=1, await_seconds=1,
                           timeout_seconds=3)
    again.expect_success(30)
    assert again.of("received") == []


def test_push_consumer_redelivers_failures_then_dead_letters(rmq_cluster: Cluster, clients: Clients,
                                                             unique_name: Callable[[str], str]) -> None:
    topic, group = unique_name("push"), unique_name("g")
    proxy = rmq_cluster.proxy_addresses[0]
    consumer = clients.python("push", endpoints=proxy, topic=topic, group=group)
    consumer.wait_event("started", timeout=60)
    clients.python("send", endpoints=proxy, topic=topic, bodies=["ok-1", "fail-1", "ok-2"]).expect_success(60)
    max_attempts = 3  # the brokers' max_delivery_attempts in this module

    def failures(c):  # type: ignore[no-untyped-def]
        return [e for e in c.of("consumed") if e["body"] == "fail-1"]

    consumer.wait(lambda c: len(failures(c)) >= max_attempts, 60, f"{max_attempts} failed deliveries")
    # After the last attempt the broker moves it to the group's dead-letter topic (at the
    # consumer's next poll once the last nack's delay ran out).
    dead = wait_until(lambda: receive_native(rmq_cluster, unique_name("dlq"), f"%DLQ%{group}", 1, timeout=1.0),
                      30, message="dead-lettered message", ignore=(txmq.TopicNotFoundError, AssertionError))
    consumer.expect_success(60)
    assert [e["delivery_attempt"] for e in failures(consumer)] == list(range(1, max_attempts + 1))
    ok = [e for e in consumer.of("consumed") if e["result"] == "SUCCESS"]
    assert sorted(e["body"] for e in ok) == ["ok-1", "ok-2"]
    assert dead[0].body == b"fail-1" and dead[0].message_id == failures(consumer)[0]["message_id"]


def test_push_consumer_auto_renew_keeps_a_slow_delivery_invisible(
        rmq_cluster: Cluster, renewing_proxy: ServiceProcess, clients: Clients,
        unique_name: Callable[[str], str]) -> None:
    """The proxy's default invisibility is 1 s; the listener works 4 s on the message. The
    proxy renews the delivery (auto_renew) until the ack: one delivery, and the ack with
    the handle the client got succeeds."""
    topic, group = unique_name("renew"), unique_name("g")
    port = renewing_proxy.metrics_port
    acks_before = metric_sum(port, "txmq_proxy_acks_total", {"result": "ok"})
    renewals_before = metric_sum(port, "txmq_proxy_renewals_total", {"result": "ok"})
    consumer = clients.python("push", endpoints=renewing_proxy.address, topic=topic, group=group,
                              hold_seconds=4.0)
    consumer.wait_event("started", timeout=60)
    clients.python("send", endpoints=renewing_proxy.address, topic=topic, bodies=["slow-1"]).expect_success(60)
    [done] = consumer.wait_event("consumed", timeout=60)
    assert done["body"] == "slow-1" and done["result"] == "SUCCESS" and done["delivery_attempt"] == 1
    # Acknowledged with the handle of the first delivery, after several renewals.
    wait_until(lambda: metric_sum(port, "txmq_proxy_acks_total", {"result": "ok"}) >= acks_before + 1, 30,
               message="the push consumer's ack to succeed on the proxy")
    assert metric_sum(port, "txmq_proxy_renewals_total", {"result": "ok"}) >= renewals_before + 3
    assert metric_sum(port, "txmq_proxy_acks_total", {"result": "INVALID_RECEIPT_HANDLE"}) == 0
    consumer.expect_success(60)
    # Never redelivered while the listener worked (a second delivery would start it again).
    assert [e["delivery_attempt"] for e in consumer.of("consuming")] == [1]


def test_native_producer_to_official_consumer_and_back(rmq_cluster: Cluster, clients: Clients,
                                                       unique_name: Callable[[str], str]) -> None:
    topic = unique_name("interop")
    proxy = rmq_cluster.proxy_addresses[1]
    # txmq SDK → official consumer: a normal and a committed transactional message.

    class Listener(txmq.TransactionListener):
        def execute_local_transaction(self, message, arg):  # type: ignore[no-untyped-def]
            return txmq.LocalTransactionState.COMMIT

        def check_local_transaction(self, message):  # type: ignore[no-untyped-def]
            return txmq.LocalTransactionState.COMMIT

    with txmq.Producer(rmq_cluster.nameserver_address) as producer:
        normal = producer.send(txmq.Message(topic, b"from-native", tag="TagN", keys=("nk",), properties={"p": "1"}))
    with txmq.TransactionProducer(rmq_cluster.nameserver_address, producer_group=unique_name("pg"),
                                  listener=Listener(), answer_checks=False) as tx_producer:
        committed = tx_producer.send_in_transaction(txmq.Message(topic, b"from-native-tx"))
    consumer = clients.python("simple", endpoints=proxy, topic=topic, group=unique_name("g"), count=2,
                              await_seconds=1)
    consumer.expect_success(60)
    got = {m["body"]: m for m in consumer.of("received")}
    assert set(got) == {"from-native", "from-native-tx"}
    assert got["from-native"]["message_id"] == normal.message_id
    assert got["from-native"]["tag"] == "TagN" and got["from-native"]["keys"] == ["nk"]
    assert got["from-native"]["properties"] == {"p": "1"}
    assert got["from-native-tx"]["message_id"] == committed.message_id

    # Official producer → txmq SDK consumer.
    sender = clients.python("send", endpoints=proxy, topic=topic, bodies=["from-official"])
    sender.expect_success(60)
    [sent] = sender.of("sent")
    group = unique_name("native")
    received = receive_native(rmq_cluster, group, topic, 3)
    by_body = {m.body: m for m in received}
    official = by_body[b"from-official"]
    assert official.message_id == sent["message_id"]
    assert official.tag == "TagA" and official.keys == ("k0",) and dict(official.properties) == {"n": "0"}


def test_simple_consumer_with_a_sql92_filter(rmq_cluster: Cluster, clients: Clients,
                                             unique_name: Callable[[str], str]) -> None:
    """The official client's FilterExpression(type SQL92) reaches the broker's filter: only
    matching messages are delivered (the others are settled for the group), and a malformed
    expression comes back as an error naming the column."""
    topic, group = unique_name("sql"), unique_name("g")
    proxy = rmq_cluster.proxy_addresses[0]
    clients.python("send", endpoints=proxy, topic=topic, bodies=[f"m{i}" for i in range(6)],
                   props={"region": "eu"}).expect_success(60)
    clients.python("send", endpoints=proxy, topic=topic, bodies=["other"], tag="TagB").expect_success(60)
    consumer = clients.python("simple", endpoints=proxy, topic=topic, group=group, count=3, await_seconds=1,
                              sql=True, filter="n >= 3 AND region = 'eu' AND TAGS = 'TagA'")
    consumer.expect_success(60)
    assert sorted(m["body"] for m in consumer.of("received")) == ["m3", "m4", "m5"]
    assert consumer.of("failed") == []
    # The group has nothing left: what the filter refused was settled, not left behind.
    again = clients.python("simple", endpoints=proxy, topic=topic, group=group, count=1, await_seconds=1,
                           timeout_seconds=3, sql=True, filter="TRUE")
    again.expect_success(30)
    assert again.of("received") == []
    bad = clients.python("simple", endpoints=proxy, topic=topic, group=unique_name("g"), count=1,
                         await_seconds=1, timeout_seconds=10, sql=True, filter="n >= ")
    bad.expect_success(30)
    failed = bad.of("failed")
    assert failed and "column 6" in failed[0]["error"], bad.describe()


def test_delay_message_is_delivered_at_its_time(rmq_cluster: Cluster, clients: Clients,
                                                unique_name: Callable[[str], str]) -> None:
    """The official client's delivery_timestamp (a DELAY message) keeps the message from
    the consumer until then; it arrives carrying its delivery timestamp."""
    topic, group = unique_name("delay"), unique_name("g")
    proxy = rmq_cluster.proxy_addresses[0]
    sender = clients.python("send", endpoints=proxy, topic=topic, bodies=["d1", "d2"], delay_ms=2000)
    sender.expect_success(60)
    consumer = clients.python("simple", endpoints=proxy, topic=topic, group=group, count=2, await_seconds=1)
    consumer.expect_success(60)
    assert_delivered_at_their_time(sender, consumer)
