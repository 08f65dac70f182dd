"""What one authenticated tenant can grow in a broker's memory with ids it chooses, on a real
cluster with auth on (``tests.support.ownership``'s principals)."""

from __future__ import annotations

import threading
import time
from typing import Iterator

import grpc
import pytest

from tests.support.cluster import Cluster
from tests.support.ownership import bearer, secured_cluster
from tests.support.waiting import wait_until
from txmq.client import MAX_ENTRIES_PER_REQUEST
from txmq.ids import ReceiptHandle
from txmq.v1 import broker_pb2, broker_pb2_grpc, checker_pb2, checker_pb2_grpc, common_pb2

pytestmark = pytest.mark.timeout(180)

RPC_TIMEOUT = 10.0
#: The broker's max_tracked_clients here.
TRACKED = 20
#: alice may answer the checks of any producer group named wild-...
WILDCARD = [{"principal": "alice", "resource": "producer_group:wild-*", "actions": ["check"]}]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cluster = secured_cluster(tmp_path_factory.mktemp("tenant-limits"), extra_acl=WILDCARD,
                              broker_env={"TXMQ_MAX_TRACKED_CLIENTS": str(TRACKED),
                                          "TXMQ_MAX_LONG_POLLING_SECONDS": "60"})
    try:
        cluster.create_topic("na", queue_count=1)
        yield cluster
    finally:
        cluster.stop()


def _clients(stub: broker_pb2_grpc.BrokerServiceStub, group: str) -> list[broker_pb2.GroupClient]:
    """The group's clients as the broker remembers them (an internal RPC: a service identity's)."""
    return list(stub.DescribeGroupClients(broker_pb2.DescribeGroupClientsRequest(group=group),
                                          timeout=RPC_TIMEOUT, metadata=bearer("nameserver")).clients)


def test_client_ids_a_tenant_makes_up_stay_bounded_behind_a_long_poll(cluster: Cluster) -> None:
    """The broker remembers each consumer (by the client id it names) for offset resets, at
    most max_tracked_clients of them. Forgetting stopped at the least recently seen one while
    it waited in a long poll: alice, holding one long poll open, made the broker remember
    every client id she sent after it (the table grew by one per receive, without bound)."""
    channel = grpc.insecure_channel(cluster.brokers[0].address)
    stub = broker_pb2_grpc.BrokerServiceStub(channel)
    poll_done = threading.Event()

    def long_poll() -> None:
        try:
            stub.ReceiveMessages(broker_pb2.ReceiveMessagesRequest(
                consumer_group="ca", topic="na", queue_id=-1, max_messages=1, invisible_duration_seconds=30,
                long_polling_timeout_seconds=55, client_id="alice-waiting"), timeout=58, metadata=bearer("alice"))
        except grpc.RpcError:
            pass
        finally:
            poll_done.set()

    poller = threading.Thread(target=long_poll, daemon=True)
    poller.start()
    try:
        wait_until(lambda: any(c.waiting for c in _clients(stub, "ca")), 30,
                   message="alice's long poll never waited")
        for i in range(3 * TRACKED):
            stub.ReceiveMessages(broker_pb2.ReceiveMessagesRequest(
                consumer_group="ca", topic="na", queue_id=-1, max_messages=1, invisible_duration_seconds=30,
                client_id=f"alice-{i}"), timeout=RPC_TIMEOUT, metadata=bearer("alice"))
        clients = _clients(stub, "ca")
        assert not poll_done.is_set(), "the long poll ended early (a loaded machine): nothing was shown"
        assert len(clients) <= TRACKED, f"{len(clients)} clients remembered, above max_tracked_clients={TRACKED}"
        # The waiting consumer is never the one forgotten (an offset reset must see it live).
        assert any(c.client_id == "alice-waiting" and c.waiting for c in clients)
    finally:
        channel.close()
        poller.join(70)


def _wild_series(port: int) -> list[str]:
    from tests.support.metrics import scrape

    return [line for line in scrape(port).splitlines() if 'group="wild-' in line]


def test_group_names_a_tenant_makes_up_leave_no_metric_series_behind(cluster: Cluster) -> None:
    """A principal with a prefix right (producer_group:wild-*) may subscribe a check stream
    to any number of group names it makes up. The checker kept eight series per group it ever
    saw, at 0, for good: /metrics (and the checker's memory) grew with every name, forever.
    A group's series go when its last producer leaves, unless it counted something."""
    checker = cluster.checkers[0]
    channel = grpc.insecure_channel(checker.address)
    stub = checker_pb2_grpc.CheckerServiceStub(channel)
    try:
        for round_ in range(3):
            groups = [f"wild-{round_}-{i}" for i in range(64)]
            subscribe = checker_pb2.CheckTransactionStateRequest(subscribe=checker_pb2.Subscribe(
                producer_groups=groups, client_id=f"alice-{round_}", check_credit=1))
            call = stub.CheckTransactionState(iter([subscribe]), timeout=RPC_TIMEOUT, metadata=bearer("alice"))
            first = next(call)
            assert first.HasField("subscribed"), first
            for _ in call:  # the stream ends once the checker read the half-close
                pass
        wait_until(lambda: not _wild_series(checker.metrics_port), 30,
                   message=lambda: f"{len(_wild_series(checker.metrics_port))} series of made-up groups left")
    finally:
        channel.close()


def test_a_producer_that_reads_nothing_is_read_no_further(cluster: Cluster) -> None:
    """Each request the checker refuses on a check stream (an unknown check id, say) queues a
    reply. The checker read on regardless of whether the producer read the replies, so a
    producer sending a flood and reading nothing grew the checker's memory without bound.
    Beyond MAX_QUEUED_REPLIES queued replies it reads no more of that stream until the
    producer reads: a drain sent after the flood is not acted on while the producer reads
    nothing, and is once it reads (every reply then arrives)."""
    from services.checker.streams import MAX_QUEUED_REPLIES
    from tests.support.metrics import metric_sum

    flood = 60 * MAX_QUEUED_REPLIES  # far beyond what the transport buffers either way
    checker = cluster.checkers[0]
    channel = grpc.insecure_channel(checker.address)
    stub = checker_pb2_grpc.CheckerServiceStub(channel)
    closing = threading.Event()

    def requests() -> Iterator[checker_pb2.CheckTransactionStateRequest]:
        yield checker_pb2.CheckTransactionStateRequest(subscribe=checker_pb2.Subscribe(
            producer_groups=["ga"], client_id="alice-flood", check_credit=1))
        bogus = checker_pb2.CheckTransactionStateRequest(received=checker_pb2.CheckReceived(check_id="nope"))
        for _ in range(flood):
            yield bogus
        yield checker_pb2.CheckTransactionStateRequest(drain=checker_pb2.CheckDrain())
        closing.wait(120)

    def connected() -> float:
        return metric_sum(checker.metrics_port, "txmq_producers_connected", {"group": "ga"})

    call = stub.CheckTransactionState(requests(), timeout=150, metadata=bearer("alice"))
    try:
        assert next(call).HasField("subscribed")
        wait_until(lambda: connected() == 1, 30, message="alice's stream never subscribed")
        # Unbounded, the checker reached the drain about 3.5 s after the subscription here;
        # bounded it never does while alice reads nothing (so this wait cannot flake).
        time.sleep(15)
        assert connected() == 1, "the checker read the whole flood while alice read nothing"
        errors = 0
        for response in call:
            errors += response.HasField("error")
            if errors == flood:
                break
        wait_until(lambda: connected() == 0, 30, message="the drain was never read once alice read")
    finally:
        closing.set()
        call.cancel()
        channel.close()


def _forged_handles(broker: str, topic: str, n: int) -> list[str]:
    """Well-formed receipt handles (a valid checksum) of messages that do not exist: each one
    the broker resolves to its owner before it may decide the call."""
    return [ReceiptHandle(broker, 1, topic, 0, 1_000_000 + i, 1).encode() for i in range(n)]


def test_lists_of_receipt_handles_beyond_the_limit_are_refused_before_any_is_resolved(cluster: Cluster) -> None:
    """The auth interceptor resolves every receipt handle of a request to its owner, on the
    broker's one event loop: only the message size bounded a list, so one AckMessages of
    85,000 handles (4.5 MB) took the broker 3.4 s, another tenant's call waiting as long. More than
    MAX_ENTRIES_PER_REQUEST handles, in an AckMessages or carried by a receive, are refused
    whole naming the field, and change nothing: alice's own handle in the list stays unacked."""
    broker = cluster.brokers[0]
    channel = grpc.insecure_channel(broker.address)
    stub = broker_pb2_grpc.BrokerServiceStub(channel)
    try:
        stub.SendMessage(broker_pb2.SendMessageRequest(message=common_pb2.Message(
            topic="na", body=b"mine", type=common_pb2.MESSAGE_TYPE_NORMAL, queue_id=0)),
            timeout=RPC_TIMEOUT, metadata=bearer("alice"))
        received: list[broker_pb2.DeliveredMessage] = []
        wait_until(lambda: received.extend(stub.ReceiveMessages(broker_pb2.ReceiveMessagesRequest(
            consumer_group="ca", topic="na", queue_id=-1, max_messages=1, invisible_duration_seconds=60,
            long_polling_timeout_seconds=1), timeout=RPC_TIMEOUT, metadata=bearer("alice")).messages) or received,
            30, message="alice's message was never delivered")
        mine = received[0].receipt_handle
        too_many = [mine, *_forged_handles(broker.name, "na", MAX_ENTRIES_PER_REQUEST)]
        calls = {
            "receipt_handles": lambda: stub.AckMessages(broker_pb2.AckMessagesRequest(
                consumer_group="ca", topic="na", receipt_handles=too_many), timeout=RPC_TIMEOUT,
                metadata=bearer("alice")),
            "ack_receipt_handles": lambda: stub.ReceiveMessages(broker_pb2.ReceiveMessagesRequest(
                consumer_group="ca", topic="na", queue_id=-1, max_messages=1, invisible_duration_seconds=60,
                ack_receipt_handles=too_many), timeout=RPC_TIMEOUT, metadata=bearer("alice")),
        }
        for field, call in calls.items():
            with pytest.raises(grpc.RpcError) as refused:
                call()
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, refused.value
            assert field in refused.value.details() and f"at most {MAX_ENTRIES_PER_REQUEST}" in refused.value.details()
        acked = stub.AckMessages(broker_pb2.AckMessagesRequest(consumer_group="ca", topic="na", receipt_handles=[mine]),
                                 timeout=RPC_TIMEOUT, metadata=bearer("alice"))
        assert [e.code for e in acked.entries] == [0], "a refused request acknowledged alice's message"
    finally:
        channel.close()


def test_a_produce_message_of_more_entries_than_the_limit_ends_the_stream_and_stores_nothing(cluster: Cluster) -> None:
    broker = cluster.brokers[0]
    channel = grpc.insecure_channel(broker.address)
    stub = broker_pb2_grpc.BrokerServiceStub(channel)
    try:
        def stored() -> int:
            offsets = stub.GetQueueOffsets(broker_pb2.GetQueueOffsetsRequest(topic="na"), timeout=RPC_TIMEOUT,
                                           metadata=bearer("alice"))
            return sum(q.max_offset for q in offsets.queues)

        before = stored()
        entries = [broker_pb2.ProduceEntry(request_id=i + 1, send_message=broker_pb2.SendMessageRequest(
            message=common_pb2.Message(topic="na", body=b"x", type=common_pb2.MESSAGE_TYPE_NORMAL, queue_id=0)))
            for i in range(MAX_ENTRIES_PER_REQUEST + 1)]
        call = stub.Produce(iter([broker_pb2.ProduceRequest(entries=entries)]), timeout=RPC_TIMEOUT,
                            metadata=bearer("alice"))
        with pytest.raises(grpc.RpcError) as refused:
            list(call)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, refused.value
        assert "entries" in refused.value.details() and f"at most {MAX_ENTRIES_PER_REQUEST}" in refused.value.details()
        assert stored() == before
    finally:
        channel.close()


def test_a_check_stream_naming_more_groups_than_any_setting_allows_is_refused_naming_the_field(
        cluster: Cluster) -> None:
    """alice may check any group named wild-...: a subscription naming 20,000 of them had each
    decided by the auth interceptor before the checker's own max_groups_per_stream refused it."""
    channel = grpc.insecure_channel(cluster.checkers[0].address)
    stub = checker_pb2_grpc.CheckerServiceStub(channel)
    try:
        subscribe = checker_pb2.CheckTransactionStateRequest(subscribe=checker_pb2.Subscribe(
            producer_groups=[f"wild-many-{i}" for i in range(20_000)], client_id="alice-many", check_credit=1))
        with pytest.raises(grpc.RpcError) as refused:
            list(stub.CheckTransactionState(iter([subscribe]), timeout=RPC_TIMEOUT, metadata=bearer("alice")))
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, refused.value
        assert "subscribe.producer_groups" in refused.value.details()
    finally:
        channel.close()
