"""The broker over real gRPC, against real name server + broker processes: statuses of
every limit, long polling, sharding over two brokers, the disk floor, metrics."""

from __future__ import annotations

import threading
import time

import grpc
import pytest
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from tests.support.metrics import metric_sum, scrape
from tests.support.waiting import wait_until
from txmq.errors import (DETAILS_METADATA_KEY, REASON_METADATA_KEY)
from txmq.ids import MessageId, TransactionId
from txmq.v1 import broker_pb2, broker_pb2_grpc, common_pb2

C = common_pb2


def stub(cluster, i: int = 0) -> broker_pb2_grpc.BrokerServiceStub:
    return broker_pb2_grpc.BrokerServiceStub(cluster.channel(cluster.brokers[i].address))


def send(s, topic: str, body: bytes = b"x", queue_id: int = 0, **fields):
    return s.SendMessage(broker_pb2.SendMessageRequest(message=C.Message(topic=topic, body=body,
                                                                        queue_id=queue_id, **fields)),
                         timeout=10)


def half(s, topic: str, body: bytes = b"h", group: str = "pg", **fields):
    return send(s, topic, body, type=C.MESSAGE_TYPE_TRANSACTION, producer_group=group, **fields)


def end(s, tid: str, resolution=C.TRANSACTION_RESOLUTION_COMMIT, **fields):
    return s.EndTransaction(broker_pb2.EndTransactionRequest(
        transaction_id=tid, resolution=resolution, source=C.TRANSACTION_SOURCE_CLIENT, **fields), timeout=10)


def receive(s, group: str, topic: str, wait: float = 0.0, n: int = 32, filter_expression: str = "*",
            invisible: float = 30.0):
    return list(s.ReceiveMessages(broker_pb2.ReceiveMessagesRequest(
        consumer_group=group, topic=topic, queue_id=-1, filter_expression=filter_expression, max_messages=n,
        invisible_duration_seconds=invisible, long_polling_timeout_seconds=wait), timeout=wait + 10).messages)


def status_of(call) -> tuple[grpc.StatusCode, str, dict[str, str]]:
    with pytest.raises(grpc.RpcError) as info:
        call()
    err = info.value
    meta = dict(err.trailing_metadata() or ())
    return err.code(), err.details(), meta


@pytest.fixture
def topic(cluster, unique_name) -> str:
    name = unique_name("orders")
    cluster.create_topic(name, queue_count=2)
    return name


def test_bad_input_gets_its_status_and_changes_nothing(cluster, topic, unique_name) -> None:
    s = stub(cluster)
    big = b"x" * (4 * 1024 * 1024 + 1)
    cases = [
        (lambda: send(s, topic, big), grpc.StatusCode.INVALID_ARGUMENT, "MESSAGE_TOO_LARGE", "max_body_bytes"),
        (lambda: send(s, "bad topic"), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_NAME", "[%|a-zA-Z0-9_-]"),
        (lambda: send(s, "x" * 128), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_NAME", "127"),
        (lambda: send(s, "%DLQ%g"), grpc.StatusCode.INVALID_ARGUMENT, "SYSTEM_TOPIC", "system topic"),
        (lambda: send(s, "%HALF%"), grpc.StatusCode.INVALID_ARGUMENT, "SYSTEM_TOPIC", "system topic"),
        (lambda: send(s, unique_name("missing")), grpc.StatusCode.NOT_FOUND, "TOPIC_NOT_FOUND", "does not exist"),
        (lambda: send(s, topic, queue_id=9), grpc.StatusCode.NOT_FOUND, "QUEUE_NOT_FOUND", "queue 9"),
        (lambda: send(s, topic, properties={f"k{i}": "v" for i in range(129)}),
         grpc.StatusCode.INVALID_ARGUMENT, "PROPERTIES_TOO_LARGE", "property count"),
        (lambda: send(s, topic, properties={"k": "v" * 40_000}),
         grpc.StatusCode.INVALID_ARGUMENT, "PROPERTIES_TOO_LARGE", "properties bytes"),
        (lambda: send(s, topic, message_id=MessageId.new("another-broker", 0).encode()),
         grpc.StatusCode.INVALID_ARGUMENT, "WRONG_BROKER", "another-broker"),
        (lambda: half(s, topic, group=""), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_NAME", "producer_group"),
        (lambda: half(s, topic, check_immunity_seconds=-1), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD",
         "check_immunity_seconds"),
        (lambda: end(s, "Tnot-an-id"), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ID", "transaction id"),
        (lambda: end(s, TransactionId(cluster.brokers[0].name, 1, 10**9).encode()),
         grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ID", "earlier store"),
        (lambda: receive(s, "g", topic, filter_expression="A ||"), grpc.StatusCode.INVALID_ARGUMENT,
         "INVALID_FIELD", "filter_expression"),
        (lambda: receive(s, "g", topic, invisible=10**9), grpc.StatusCode.INVALID_ARGUMENT,
         "INVALID_FIELD", "invisible_duration_seconds"),
        (lambda: receive(s, "bad group", topic), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_NAME", "consumer_group"),
        (lambda: s.ChangeInvisibleDuration(broker_pb2.ChangeInvisibleDurationRequest(
            consumer_group="g", topic=topic, receipt_handle="Rxyz", invisible_duration_seconds=1), timeout=5),
         grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ID", "receipt handle"),
    ]
    before = s.GetBrokerStats(broker_pb2.GetBrokerStatsRequest(), timeout=5)
    for call, code, reason, words in cases:
        got_code, details, meta = status_of(call)
        assert (got_code, meta.get(REASON_METADATA_KEY)) == (code, reason), details
        assert words in details
        assert DETAILS_METADATA_KEY in meta
    after = s.GetBrokerStats(broker_pb2.GetBrokerStatsRequest(), timeout=5)
    assert after.groups == before.groups
    assert receive(s, unique_name("g"), topic) == []


def test_minted_transaction_is_invalid_and_conflict_is_failed_precondition(cluster, topic) -> None:
    s = stub(cluster)
    sent = half(s, topic)
    rolled = end(s, sent.transaction_id, C.TRANSACTION_RESOLUTION_ROLLBACK)
    assert rolled.state == C.TRANSACTION_STATE_ROLLED_BACK
    code, details, meta = status_of(lambda: end(s, sent.transaction_id))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "ROLLED_BACK" in details
    assert meta[REASON_METADATA_KEY] == "TRANSACTION_STATE_CONFLICT"
    # An id the broker never issued (its sequence made up) is refused before any lookup.
    minted = TransactionId(cluster.brokers[0].name, TransactionId.decode(sent.transaction_id).store_id, 10**12)
    code, details, meta = status_of(lambda: end(s, minted.encode()))
    assert (code, meta[REASON_METADATA_KEY]) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ID"), details
    assert "not an id this broker issued" in details


def test_produce_stream_answers_each_request_by_id(cluster, topic) -> None:
    s = stub(cluster)
    first = half(s, topic)

    def entries():
        for i in range(50):
            yield broker_pb2.ProduceEntry(request_id=i, send_message=broker_pb2.SendMessageRequest(
                message=C.Message(topic=topic, body=str(i).encode(), queue_id=i % 2)))
        yield broker_pb2.ProduceEntry(request_id=100, send_message=broker_pb2.SendMessageRequest(
            message=C.Message(topic="%HALF%", body=b"no")))
        yield broker_pb2.ProduceEntry(request_id=101, end_transaction=broker_pb2.EndTransactionRequest(
            transaction_id=first.transaction_id, resolution=C.TRANSACTION_RESOLUTION_COMMIT,
            source=C.TRANSACTION_SOURCE_CLIENT))
        # The same half message twice in one stream message: the broker writes a message's
        # entries as one batch, and the repeat must still see the first.
        for request_id in (102, 103):
            yield broker_pb2.ProduceEntry(request_id=request_id, send_message=broker_pb2.SendMessageRequest(
                message=C.Message(topic=topic, body=b"twice", type=C.MESSAGE_TYPE_TRANSACTION,
                                  producer_group="pg", message_id=f"twice-{topic}")))

    all_entries = list(entries())
    # Some requests alone, some batched in one stream message.
    requests = [broker_pb2.ProduceRequest(entries=[e]) for e in all_entries[:10]] + \
               [broker_pb2.ProduceRequest(entries=all_entries[10:])]
    responses = {r.request_id: r for response in s.Produce(iter(requests), timeout=30) for r in response.results}
    assert sorted(responses) == [*range(50), 100, 101, 102, 103]
    assert all(responses[i].status.code == 0 and responses[i].send_message.queue_offset >= 0 for i in range(50))
    assert responses[100].status.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert responses[100].status.reason == "SYSTEM_TOPIC"
    assert responses[101].end_transaction.state == C.TRANSACTION_STATE_COMMITTED
    once, twice = responses[102].send_message, responses[103].send_message
    assert not once.duplicate and twice.duplicate and twice.transaction_id == once.transaction_id


def test_a_half_sent_again_after_its_rollback_is_refused_and_a_prepared_one_deduplicates(cluster, topic) -> None:
    """A repeat of a half whose transaction a check (or its producer) rolled back is
    FAILED_PRECONDITION, so its sender runs no local transaction for a message that can
    never commit; a repeat of one still prepared answers the first, as before."""
    s = stub(cluster)
    first = half(s, topic, b"once", message_id=f"again-{topic}")
    assert half(s, topic, b"once", message_id=f"again-{topic}").duplicate
    end(s, first.transaction_id, C.TRANSACTION_RESOLUTION_ROLLBACK)
    code, details, _meta = status_of(lambda: half(s, topic, b"once", message_id=f"again-{topic}"))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert "is ROLLED_BACK: a half message sent again" in details and f"again-{topic}" in details


def test_long_poll_wakes_on_commit(cluster, topic, unique_name) -> None:
    s = stub(cluster)
    group = unique_name("g")
    assert receive(s, group, topic) == []
    sent = half(s, topic, b"wake")
    result: list = []
    started = time.monotonic()
    poller = threading.Thread(target=lambda: result.append(receive(s, group, topic, wait=20.0)))
    poller.start()
    end(s, sent.transaction_id)
    poller.join(30)
    assert [m.message.body for m in result[0]] == [b"wake"]
    # Woken by the commit, not by the end of the 20 s poll.
    assert time.monotonic() - started < 20.0


def test_redelivery_with_attempts_then_dead_letter_topic(cluster, topic, unique_name) -> None:
    # The session cluster's brokers run with TXMQ_MAX_DELIVERY_ATTEMPTS=4.
    s = stub(cluster)
    group = unique_name("g")
    send(s, topic, b"poison", tag="P")
    attempts = []
    deadline = time.monotonic() + 30
    while len(attempts) < 4 and time.monotonic() < deadline:
        for m in receive(s, group, topic, wait=2.0, invisible=0.2):
            attempts.append(m.delivery_attempt)
    assert attempts == [1, 2, 3, 4]
    dlq = f"%DLQ%{group}"
    got = []
    deadline = time.monotonic() + 15
    while not got and time.monotonic() < deadline:
        receive(s, group, topic, wait=0.3, invisible=0.2)  # lets the 4th invisibility expire into the DLQ
        try:
            got = receive(s, unique_name("redrive"), dlq, wait=0.5)
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.NOT_FOUND  # the DLQ topic appears with its first message
    assert [(m.topic, m.message.topic, m.message.body, m.message.tag) for m in got] == [(dlq, topic, b"poison", "P")]


def test_topic_sharded_over_two_brokers(fresh_cluster_factory, unique_name) -> None:
    cluster = fresh_cluster_factory(brokers=2)
    topic = unique_name("sharded")
    cluster.create_topic(topic, queue_count=4)
    routes = cluster.query_route(topic)
    assert sorted((r.broker_name, r.queue_id) for r in routes) == [
        ("broker-0", 0), ("broker-0", 1), ("broker-1", 0), ("broker-1", 1)]
    sent = set()
    for r in routes:
        s = broker_pb2_grpc.BrokerServiceStub(cluster.channel(r.broker_address))
        body = f"{r.broker_name}/{r.queue_id}".encode()
        tx = half(s, topic, body, queue_id=r.queue_id)
        end(s, tx.transaction_id)
        sent.add(body)
    group = unique_name("g")
    got = set()
    for i in range(2):
        got |= {m.message.body for m in receive(stub(cluster, i), group, topic)}
    assert got == sent


def test_disk_floor_refuses_sends_with_resource_exhausted(fresh_cluster_factory, unique_name) -> None:
    cluster = fresh_cluster_factory(broker_env={"TXMQ_MIN_FREE_DISK_BYTES": str(2**62)})
    topic = unique_name("full")
    cluster.create_topic(topic, queue_count=1)
    code, details, meta = status_of(lambda: send(stub(cluster), topic))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert meta[REASON_METADATA_KEY] == "DISK_FULL" and "min_free_disk_bytes" in details


def test_each_call_is_timed_under_its_status_and_reflection_is_served(cluster, unique_name) -> None:
    """Auth off, the shared interceptor chain wraps each method once as it is registered
    (``interceptors.Registrar``): every call is still refused, mapped and timed on its own,
    and reflection is served by its asyncio servicer."""
    s = stub(cluster)
    port = cluster.brokers[0].metrics_port

    def refused() -> float:
        return metric_sum(port, "txmq_rpc_duration_seconds_count", {"method": "ReceiveMessages", "code": "NOT_FOUND"})
    before = refused()
    missing = unique_name("missing")
    for _ in range(3):
        code, details, _meta = status_of(lambda: receive(s, "g", missing))
        assert code == grpc.StatusCode.NOT_FOUND and missing in details
    # The call is timed once its status is sent: the client may read it first.
    wait_until(lambda: refused() >= before + 3, timeout=10, message=lambda: f"{refused() - before} timed")
    assert refused() == before + 3
    services = ProtoReflectionDescriptorDatabase(cluster.channel(cluster.brokers[0].address)).get_services()
    assert {"txmq.v1.BrokerService", "grpc.health.v1.Health"} <= set(services)


def test_metrics_describe_pending_transactions_and_lag(cluster, topic, unique_name) -> None:
    s = stub(cluster)
    group = unique_name("pg")
    half(s, topic, group=group)
    send(s, topic, b"lagging")
    receive(s, unique_name("lagger"), topic, n=1, invisible=60)
    text = scrape(cluster.brokers[0].metrics_port)
    assert f'txmq_transactions_pending{{group="{group}"}} 1.0' in text
    assert f'txmq_transaction_oldest_pending_age_seconds{{group="{group}"}}' in text
    assert 'txmq_rpc_duration_seconds_count{code="OK",method="SendMessage",service="broker"}' in text
    assert f'txmq_messages_in_total{{topic="{topic}",type="transaction"}}' in text
    assert "txmq_consumer_lag_messages{" in text and "txmq_disk_free_bytes" in text
