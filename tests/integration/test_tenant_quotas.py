"""What one authenticated tenant can create with a prefix right by making names up, on a real
cluster with auth on: consumer groups and their subscriptions (by receiving, by resetting
offsets), producer groups (by sending half messages) and topics (CreateTopic, auto-creating
route lookups). Each is held to its per-principal quota; the name at the limit keeps working;
what an operator of the cluster creates is not counted. Each tenant is a principal of its
own, so each test counts only its own names."""

from __future__ import annotations

from typing import Iterator

import grpc
import pytest

from tests.support.cluster import Cluster
from tests.support.metrics import metric_sum
from tests.support.ownership import bearer, secured_cluster
from txmq.v1 import admin_pb2, admin_pb2_grpc, broker_pb2, broker_pb2_grpc, common_pb2, nameserver_pb2, \
    nameserver_pb2_grpc

pytestmark = pytest.mark.timeout(180)

RPC_TIMEOUT = 10.0
GROUPS, SUBSCRIPTIONS, PRODUCER_GROUPS, TOPICS = 3, 4, 2, 2
TENANTS = ("groups-app", "subs-app", "txn-app", "topic-app", "reset-app", "del-app", "pdel-app")
ACL = [
    {"principal": "groups-app", "resource": "consumer_group:cg-*", "actions": ["subscribe"]},
    {"principal": "groups-app", "resource": "topic:qt", "actions": ["subscribe"]},
    {"principal": "subs-app", "resource": "consumer_group:cs-*", "actions": ["subscribe"]},
    {"principal": "subs-app", "resource": "topic:qt*", "actions": ["subscribe"]},
    {"principal": "txn-app", "resource": "producer_group:pg-*", "actions": ["check"]},
    {"principal": "txn-app", "resource": "topic:qt", "actions": ["publish"]},
    {"principal": "topic-app", "resource": "topic:tt-*", "actions": ["publish", "admin-write"]},
    {"principal": "reset-app", "resource": "consumer_group:cr-*", "actions": ["admin-write"]},
    {"principal": "reset-app", "resource": "topic:qt", "actions": ["subscribe"]},
    {"principal": "del-app", "resource": "consumer_group:cd-*", "actions": ["subscribe", "admin-write"]},
    {"principal": "del-app", "resource": "topic:qt", "actions": ["subscribe"]},
    {"principal": "pdel-app", "resource": "producer_group:pd-*", "actions": ["check", "admin-write"]},
    {"principal": "pdel-app", "resource": "topic:qt", "actions": ["publish"]},
]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with secured_cluster(tmp_path_factory.mktemp("tenant-quotas"), extra_acl=ACL, extra_native=TENANTS,
                         auto_create_topics=True,
                         broker_env={"TXMQ_MAX_CONSUMER_GROUPS_PER_PRINCIPAL": str(GROUPS),
                                     "TXMQ_MAX_SUBSCRIPTIONS_PER_PRINCIPAL": str(SUBSCRIPTIONS),
                                     "TXMQ_MAX_PRODUCER_GROUPS_PER_PRINCIPAL": str(PRODUCER_GROUPS)},
                         nameserver_env={"TXMQ_MAX_TOPICS_PER_PRINCIPAL": str(TOPICS)}) as cluster:
        for topic in ("qt", "qt2", "qt3"):
            cluster.create_topic(topic, queue_count=2)
        yield cluster


#: Plain channels (the cluster's own carry the operator's token), by address.
_CHANNELS: dict[str, grpc.Channel] = {}


def _channel(address: str) -> grpc.Channel:
    if address not in _CHANNELS:
        _CHANNELS[address] = grpc.insecure_channel(address)
    return _CHANNELS[address]


@pytest.fixture(scope="module", autouse=True)
def _close_channels() -> Iterator[None]:
    yield
    for channel in _CHANNELS.values():
        channel.close()
    _CHANNELS.clear()


def _broker(cluster: Cluster) -> broker_pb2_grpc.BrokerServiceStub:
    return broker_pb2_grpc.BrokerServiceStub(_channel(cluster.brokers[0].address))


def _admin(cluster: Cluster) -> admin_pb2_grpc.AdminServiceStub:
    return admin_pb2_grpc.AdminServiceStub(_channel(cluster.nameserver_address))


def _receive(cluster: Cluster, who: str, group: str, topic: str = "qt") -> broker_pb2.ReceiveMessagesResponse:
    return _broker(cluster).ReceiveMessages(broker_pb2.ReceiveMessagesRequest(
        consumer_group=group, topic=topic, queue_id=-1, max_messages=1, invisible_duration_seconds=30),
        timeout=RPC_TIMEOUT, metadata=bearer(who))


def _groups_held(cluster: Cluster) -> set[tuple[str, str]]:
    """(group, topic) pairs with positions on the broker (an internal RPC: a service identity's)."""
    answer = _broker(cluster).DescribeConsumerGroups(broker_pb2.DescribeConsumerGroupsRequest(),
                                                     timeout=RPC_TIMEOUT, metadata=bearer("nameserver"))
    return {(q.consumer_group, q.topic) for q in answer.queues}


def _refusals(cluster: Cluster, setting: str) -> float:
    """txmq_quota_refusals_total of ``setting`` on the service that holds it."""
    service = cluster.nameservers[0] if setting == "max_topics_per_principal" else cluster.brokers[0]
    return metric_sum(service.metrics_port, "txmq_quota_refusals_total", {"setting": setting})


def _refused(cluster: Cluster, call, setting: str, limit: int) -> grpc.RpcError:  # type: ignore[no-untyped-def]
    """``call`` refused at the quota ``setting`` (and counted on its service's /metrics)."""
    counted = _refusals(cluster, setting)
    with pytest.raises(grpc.RpcError) as caught:
        call()
    assert _refusals(cluster, setting) == counted + 1, f"the refusal at {setting} was not counted"
    error = caught.value
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error
    assert f"{setting}={limit}" in error.details(), error.details()
    assert dict(error.trailing_metadata() or ()).get("txmq-reason") == "QUOTA_EXCEEDED"
    return error


def test_consumer_groups_a_tenant_makes_up_are_bounded_across_a_restart(cluster: Cluster) -> None:
    """A principal subscribing as consumer_group:cg-* gave the broker a new group — cursors
    in its store for every queue, kept for good — with every receive naming a new one. The
    N+1-th is refused with nothing created; the groups it has keep receiving, also after a
    restart (the count is what the store holds); an operator of the cluster is not counted."""
    for i in range(GROUPS):
        _receive(cluster, "groups-app", f"cg-{i}")
    _refused(cluster, lambda: _receive(cluster, "groups-app", f"cg-{GROUPS}"), "max_consumer_groups_per_principal", GROUPS)
    assert not any(g == f"cg-{GROUPS}" for g, _t in _groups_held(cluster))
    _receive(cluster, "groups-app", "cg-0")  # the existing ones keep working
    _receive(cluster, "operator", "cg-by-operator")  # cluster rights: not counted

    cluster.restart_broker(0)
    _refused(cluster, lambda: _receive(cluster, "groups-app", "cg-after-restart"), "max_consumer_groups_per_principal", GROUPS)
    _receive(cluster, "groups-app", f"cg-{GROUPS - 1}")


def test_subscriptions_of_a_tenants_groups_are_bounded(cluster: Cluster) -> None:
    """A group of the principal's subscribing to one more topic gives it a cursor per queue of
    that topic: (group, topic) pairs are bounded too, with groups well within their own quota."""
    _receive(cluster, "subs-app", "cs-0", "qt")
    _receive(cluster, "subs-app", "cs-0", "qt2")
    _receive(cluster, "subs-app", "cs-0", "qt3")
    _receive(cluster, "subs-app", "cs-1", "qt")
    _refused(cluster, lambda: _receive(cluster, "subs-app", "cs-1", "qt2"), "max_subscriptions_per_principal", SUBSCRIPTIONS)
    assert ("cs-1", "qt2") not in _groups_held(cluster)
    _receive(cluster, "subs-app", "cs-0", "qt2")


def _half(cluster: Cluster, who: str, group: str) -> broker_pb2.SendMessageResponse:
    return _broker(cluster).SendMessage(broker_pb2.SendMessageRequest(message=common_pb2.Message(
        topic="qt", body=b"x", type=common_pb2.MESSAGE_TYPE_TRANSACTION, producer_group=group,
        producer_client_id=f"{who}-1")), timeout=RPC_TIMEOUT, metadata=bearer(who))


def _producer_groups(cluster: Cluster) -> set[str]:
    stats = _broker(cluster).GetBrokerStats(broker_pb2.GetBrokerStatsRequest(), timeout=RPC_TIMEOUT,
                                            metadata=bearer("operator"))
    return {g.producer_group for g in stats.groups}


def test_producer_groups_a_tenant_makes_up_are_bounded(cluster: Cluster) -> None:
    """One half message naming a new producer group (check on producer_group:pg-*) left a
    counters row and its metric series on the broker for good. Beyond the quota a half
    message of a new group is refused, on a Produce stream too (in band, in its entry),
    and nothing of it is stored; the tenant's groups keep sending."""
    for i in range(PRODUCER_GROUPS):
        _half(cluster, "txn-app", f"pg-{i}")
    _refused(cluster, lambda: _half(cluster, "txn-app", f"pg-{PRODUCER_GROUPS}"), "max_producer_groups_per_principal",
             PRODUCER_GROUPS)
    stream = _broker(cluster).Produce(iter([broker_pb2.ProduceRequest(entries=[
        broker_pb2.ProduceEntry(request_id=1, send_message=broker_pb2.SendMessageRequest(message=common_pb2.Message(
            topic="qt", body=b"x", type=common_pb2.MESSAGE_TYPE_TRANSACTION, producer_group="pg-stream",
            producer_client_id="txn-app-1")))])]), timeout=RPC_TIMEOUT, metadata=bearer("txn-app"))
    (entry,) = [r for response in stream for r in response.results]
    assert entry.status.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0], entry
    assert entry.status.reason == "QUOTA_EXCEEDED" and "max_producer_groups_per_principal" in entry.status.message
    groups = _producer_groups(cluster)
    assert {"pg-0", "pg-1"} <= groups and not groups & {f"pg-{PRODUCER_GROUPS}", "pg-stream"}, groups
    _half(cluster, "txn-app", "pg-0")


def _route(cluster: Cluster, who: str, topic: str) -> nameserver_pb2.QueryRouteResponse:
    stub = nameserver_pb2_grpc.NameServerServiceStub(_channel(cluster.nameserver_address))
    return stub.QueryRoute(nameserver_pb2.QueryRouteRequest(topic=topic, for_send=True), timeout=RPC_TIMEOUT,
                           metadata=bearer(who))


def _create(cluster: Cluster, who: str, topic: str) -> admin_pb2.CreateTopicResponse:
    return _admin(cluster).CreateTopic(admin_pb2.CreateTopicRequest(topic=topic, queue_count=1), timeout=RPC_TIMEOUT,
                             metadata=bearer(who))


def test_topics_a_tenant_makes_up_are_bounded(cluster: Cluster) -> None:
    """With a prefix right (topic:tt-*) and auto_create_topics, every route lookup of a new
    name created a topic with queues on the brokers. Beyond the quota neither CreateTopic nor
    an auto-creating lookup creates one; deleting one frees its place."""
    _create(cluster, "topic-app", "tt-0")
    assert _route(cluster, "topic-app", "tt-1").queues  # auto-created
    _refused(cluster, lambda: _create(cluster, "topic-app", "tt-2"), "max_topics_per_principal", TOPICS)
    _refused(cluster, lambda: _route(cluster, "topic-app", "tt-3"), "max_topics_per_principal", TOPICS)
    listed = {t.topic for t in _admin(cluster).ListTopics(admin_pb2.ListTopicsRequest(), timeout=RPC_TIMEOUT,
                                                          metadata=bearer("operator")).topics}
    assert {"tt-0", "tt-1"} <= listed and not listed & {"tt-2", "tt-3"}, listed
    assert _route(cluster, "topic-app", "tt-0").queues  # the existing ones keep working
    _admin(cluster).DeleteTopic(admin_pb2.DeleteTopicRequest(topic="tt-0"), timeout=RPC_TIMEOUT,
                                metadata=bearer("operator"))
    _create(cluster, "topic-app", "tt-2")


def _reset(cluster: Cluster, group: str, *, dry_run: bool = False) -> admin_pb2.ResetOffsetsResponse:
    return _admin(cluster).ResetOffsets(admin_pb2.ResetOffsetsRequest(
        consumer_group=group, topic="qt", target=broker_pb2.RESET_TARGET_LATEST, dry_run=dry_run,
        reason="quota test"), timeout=RPC_TIMEOUT, metadata=bearer("reset-app"))


def test_offset_resets_count_against_the_groups_quota(cluster: Cluster) -> None:
    """A reset of a group the broker never saw gives it positions (the name server relays it
    as its own call, naming the principal): resets are held to the principal's quota too,
    and a dry run says so before anything is applied."""
    for i in range(GROUPS):
        assert _reset(cluster, f"cr-{i}").applied
    _refused(cluster, lambda: _reset(cluster, f"cr-{GROUPS}", dry_run=True), "max_consumer_groups_per_principal", GROUPS)
    _refused(cluster, lambda: _reset(cluster, f"cr-{GROUPS}"), "max_consumer_groups_per_principal", GROUPS)
    assert not any(g == f"cr-{GROUPS}" for g, _t in _groups_held(cluster))
    assert _reset(cluster, "cr-0").applied


def _delete(cluster: Cluster, who: str, group: str) -> admin_pb2.DeleteConsumerGroupResponse:
    return _admin(cluster).DeleteConsumerGroup(admin_pb2.DeleteConsumerGroupRequest(
        consumer_group=group, force=True), timeout=RPC_TIMEOUT, metadata=bearer(who))


def test_deleting_a_group_frees_its_place_and_needs_admin_write_on_it(cluster: Cluster) -> None:
    """At its max_consumer_groups_per_principal a principal deletes one of its groups (it
    holds admin-write on them) and can make a new one; a group it holds no right on is
    refused PERMISSION_DENIED, the same whether that group exists or not."""
    for i in range(GROUPS):
        _receive(cluster, "del-app", f"cd-{i}")
    _refused(cluster, lambda: _receive(cluster, "del-app", f"cd-{GROUPS}"), "max_consumer_groups_per_principal", GROUPS)
    _receive(cluster, "operator", "not-a-tenant-group")  # someone else's group, with a live consumer
    refusals = []
    for group in ("not-a-tenant-group", "not-a-tenant-gone"):
        with pytest.raises(grpc.RpcError) as caught:
            _delete(cluster, "del-app", group)
        assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED, caught.value
        refusals.append(caught.value.details().replace(group, "GROUP"))
    assert refusals[0] == refusals[1], refusals  # nothing learned of the other group
    assert ("not-a-tenant-group", "qt") in _groups_held(cluster)
    done = _delete(cluster, "del-app", "cd-0")
    assert done.applied and done.operator == "del-app" and sum(b.cursors for b in done.brokers) == 2
    assert not any(g == "cd-0" for g, _t in _groups_held(cluster))
    _receive(cluster, "del-app", f"cd-{GROUPS}")  # its place is free
    _refused(cluster, lambda: _receive(cluster, "del-app", "cd-0"), "max_consumer_groups_per_principal", GROUPS)


def _ended_half(cluster: Cluster, who: str, group: str) -> None:
    sent = _half(cluster, who, group)
    _broker(cluster).EndTransaction(broker_pb2.EndTransactionRequest(
        transaction_id=sent.transaction_id, resolution=common_pb2.TRANSACTION_RESOLUTION_ROLLBACK,
        source=common_pb2.TRANSACTION_SOURCE_CLIENT, producer_group=group), timeout=RPC_TIMEOUT,
        metadata=bearer(who))


def _delete_producer(cluster: Cluster, who: str, group: str) -> admin_pb2.DeleteProducerGroupResponse:
    return _admin(cluster).DeleteProducerGroup(admin_pb2.DeleteProducerGroupRequest(
        producer_group=group, force=True), timeout=RPC_TIMEOUT, metadata=bearer(who))


def test_deleting_a_producer_group_frees_its_place_and_needs_admin_write_on_it(cluster: Cluster) -> None:
    """At its max_producer_groups_per_principal a principal deletes one of its producer groups
    (its transactions ended; it holds admin-write on them) and can make a new one; a group it
    holds no right on is refused PERMISSION_DENIED, the same whether that group exists or not."""
    for i in range(PRODUCER_GROUPS):
        _ended_half(cluster, "pdel-app", f"pd-{i}")
    _refused(cluster, lambda: _half(cluster, "pdel-app", f"pd-{PRODUCER_GROUPS}"), "max_producer_groups_per_principal",
             PRODUCER_GROUPS)
    _ended_half(cluster, "txn-app", "pg-0")  # another tenant's group
    refusals = []
    for group in ("pg-0", "pg-not-made"):
        with pytest.raises(grpc.RpcError) as caught:
            _delete_producer(cluster, "pdel-app", group)
        assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED, caught.value
        refusals.append(caught.value.details().replace(group, "GROUP"))
    assert refusals[0] == refusals[1], refusals  # nothing learned of the other group
    assert "pg-0" in _producer_groups(cluster)
    done = _delete_producer(cluster, "pdel-app", "pd-0")
    assert done.applied and done.operator == "pdel-app" and [b.counters for b in done.brokers] == [True]
    assert "pd-0" not in _producer_groups(cluster)
    _ended_half(cluster, "pdel-app", f"pd-{PRODUCER_GROUPS}")  # its place is free
    _refused(cluster, lambda: _half(cluster, "pdel-app", "pd-0"), "max_producer_groups_per_principal", PRODUCER_GROUPS)
