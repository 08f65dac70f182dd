"""What a principal learns of another tenant's resources: nothing, from the listings open to
every principal or from a refusal.

The listings any authenticated principal may call show it only what it holds a right on.

``BrokerService.GetBrokerStats`` (a broker's limits, for clients and proxies) and
``NameServerService.ListBrokers`` (the brokers' addresses, for routing) are open to every
principal, but they also carry every topic of the broker, every producer group's pending
and discarded counts, and the newest transaction id: what ``AdminService.ListTopics`` /
``DescribeBrokers`` and ``QueryTransactions`` keep to operators. A principal of one tenant
must not learn another's topic and group names, or an id of another group's transaction,
from them. A service identity and an operator with ``admin-read`` on the cluster see all.

A refusal of an id that belongs to a resource the caller holds no right on says so without
naming that resource: a captured transaction id or receipt handle does not tell its holder
the other tenant's group or topic."""

from __future__ import annotations

from typing import Any, Callable, Iterator

import grpc
import pytest

from tests.support.cluster import Cluster
from tests.support.ownership import Census, Native, bearer, secured_cluster
from txmq.v1 import broker_pb2, broker_pb2_grpc, common_pb2, nameserver_pb2, nameserver_pb2_grpc

pytestmark = pytest.mark.timeout(180)

RPC_TIMEOUT = 10.0


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, Native, dict[str, str]]]:
    cluster = secured_cluster(tmp_path_factory.mktemp("listings"))
    native = Native(cluster, Census())
    try:
        for topic in ("na", "nb", "tb"):
            cluster.create_topic(topic, queue_count=1)
        native.normal("owner", "tb")
        ids = {"owner_handle": native.receive("owner", "cs", "tb")[0].receipt_handle,
               "alice": native.half("alice", "na", "ga").transaction_id,
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
    assert {"na", "nb", "tb"} <= _listed_topics(cluster, native, "operator")


def _refusal(call: Callable[[], Any]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED, caught.value
    return caught.value


def test_a_refusal_does_not_name_another_tenants_group_or_topic(
        seeded: tuple[Cluster, Native, dict[str, str]]) -> None:
    _cluster, native, ids = seeded
    alice = native.stub("alice")
    for named in ("ga", ""):  # her own group named, or none (resolved all the same)
        refused = _refusal(lambda g=named: alice.EndTransaction(broker_pb2.EndTransactionRequest(
            transaction_id=ids["bob"], producer_group=g, resolution=common_pb2.TRANSACTION_RESOLUTION_COMMIT,
            source=common_pb2.TRANSACTION_SOURCE_CLIENT), timeout=RPC_TIMEOUT))
        assert "'gb'" not in _everything(refused) and "\\'gb\\'" not in _everything(refused), _everything(refused)
        assert "producer_group" in (refused.details() or "")
    # reader shares the group cs with owner, but may read ta only: owner's tb handle.
    refused = _refusal(lambda: native.stub("reader").AckMessages(broker_pb2.AckMessagesRequest(
        consumer_group="cs", topic="ta", receipt_handles=[ids["owner_handle"]]), timeout=RPC_TIMEOUT))
    assert "'tb'" not in _everything(refused) and "\\'tb\\'" not in _everything(refused), _everything(refused)
    assert "topic" in (refused.details() or "")
    # Nothing changed (a caller allowed on the group is still told it: tests/unit/test_ownership_decisions.py).
    assert native.state_of(ids["bob"]) == common_pb2.TRANSACTION_STATE_PREPARED


def _everything(error: grpc.RpcError) -> str:
    """The refusal's details and trailing metadata, as a caller can read them."""
    return " ".join([error.details() or "", *(f"{k}={v!r}" for k, v in (error.trailing_metadata() or ()))])
