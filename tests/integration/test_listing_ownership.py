"""The listings any authenticated principal may call show it only what it holds a right on.

``BrokerService.GetBrokerStats`` (a broker's limits, for clients and proxies) and
``NameServerService.ListBrokers`` (the brokers' addresses, for routing) are open to every
principal, but they also carry every topic of the broker, every producer group's pending
and discarded counts, and the newest transaction id: what ``AdminService.ListTopics`` /
``DescribeBrokers`` and ``QueryTransactions`` keep to operators. A principal of one tenant
must not learn another's topic and group names, or an id of another group's transaction,
from them. A service identity and an operator with ``admin-read`` on the cluster see all."""

from __future__ import annotations

from typing import Iterator

import pytest

from tests.support.cluster import Cluster
from tests.support.ownership import Census, Native, bearer, secured_cluster
from txmq.v1 import broker_pb2, broker_pb2_grpc, nameserver_pb2, nameserver_pb2_grpc

pytestmark = pytest.mark.timeout(180)

RPC_TIMEOUT = 10.0


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, Native, dict[str, str]]]:
    cluster = secured_cluster(tmp_path_factory.mktemp("listings"))
    native = Native(cluster, Census())
    try:
        for topic in ("na", "nb"):
            cluster.create_topic(topic, queue_count=1)
        ids = {"alice": native.half("alice", "na", "ga").transaction_id,
               "bob": native.half("bob", "nb", "gb").transaction_id}  # the newest: bob's
        yield cluster, native, ids
    finally:
        native.close()
        cluster.stop()


def _stats(native: Native, who: str) -> broker_pb2.GetBrokerStatsResponse:
    stub = broker_pb2_grpc.BrokerServiceStub(native.raw(native.broker_address))
    return stub.GetBrokerStats(broker_pb2.GetBrokerStatsRequest(), metadata=bearer(who), timeout=RPC_TIMEOUT)


def _listed_topics(cluster: Cluster, native: Native, who: str) -> set[str]:
    stub = nameserver_pb2_grpc.NameServerServiceStub(native.raw(cluster.nameserver_address))
    brokers = stub.ListBrokers(nameserver_pb2.ListBrokersRequest(include_followers=True), metadata=bearer(who),
                               timeout=RPC_TIMEOUT).brokers
    assert [b.address for b in brokers] == [native.broker_address]  # what routing needs, for anyone
    return {t.topic for b in brokers for t in b.topics}


def test_broker_stats_show_a_principal_only_its_own_topics_and_groups(
        seeded: tuple[Cluster, Native, dict[str, str]]) -> None:
    _cluster, native, ids = seeded
    alice = _stats(native, "alice")
    assert alice.max_body_bytes > 0 and alice.max_delivery_attempts > 0  # the limits, for anyone
    assert {t.topic for t in alice.topics} == {"na"}
    assert {g.producer_group for g in alice.groups} == {"ga"}
    # The newest transaction is bob's: its id is not alice's to hold.
    assert alice.last_transaction_id == ""

    operator = _stats(native, "operator")
    assert {"na", "nb"} <= {t.topic for t in operator.topics}
    assert {"ga", "gb"} <= {g.producer_group for g in operator.groups}
    assert operator.last_transaction_id == ids["bob"]


def test_list_brokers_shows_a_principal_only_its_own_topics(seeded: tuple[Cluster, Native, dict[str, str]]) -> None:
    cluster, native, _ids = seeded
    assert _listed_topics(cluster, native, "alice") == {"na"}
    assert _listed_topics(cluster, native, "reader") == set()  # ta: not created here
    assert {"na", "nb"} <= _listed_topics(cluster, native, "operator")
