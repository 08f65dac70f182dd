"""The official clients' namespace through the proxy (Python: ``ClientConfiguration(namespace=)``,
which sets ``Resource.resource_namespace`` everywhere and the ``x-mq-namespace`` header;
Node.js: ``namespace`` in the options, which sets the header and only a producer's topic
resources). Two namespaces hold a topic and a group of the same name with nothing crossing:
sends, transactions, an orphan's check, receives; the native SDK with ``namespace=`` reads
what they sent, and what comes back to the clients names the topic without the namespace."""

from __future__ import annotations

import uuid
from typing import Callable

import pytest

import txmq
from tests.support.cluster import Cluster
from tests.support.waiting import wait_until
from txmq.v1 import common_pb2

from .support import Clients, node_ready
from .test_python_client import transaction_of

pytestmark = pytest.mark.timeout(180)


def _namespaces() -> tuple[str, str]:
    run = uuid.uuid4().hex[:8]
    return f"nsa{run}", f"nsb{run}"


def _native(cluster: Cluster, namespace: str, topic: str, count: int, timeout: float = 30.0) -> list[bytes]:
    """What a native consumer group of ``namespace`` receives from its ``topic``."""
    got: list[bytes] = []
    with txmq.SimpleConsumer(cluster.nameserver_address, consumer_group="native", subscriptions={topic: "*"},
                             namespace=namespace, await_duration_seconds=0.5) as consumer:
        def step() -> bool:
            for m in consumer.receive(16, 10.0):
                got.append(m.body)
                consumer.ack(m)
            return len(got) >= count
        wait_until(step, timeout, interval=0.0, message=f"{count} message(s) in {namespace}%{topic}")
    return got


def test_python_client_in_two_namespaces(rmq_cluster: Cluster, clients: Clients,
                                         unique_name: Callable[[str], str]) -> None:
    a, b = _namespaces()
    topic = unique_name("nstopic")
    proxy = rmq_cluster.proxy_addresses[0]
    clients.python("transactional", endpoints=proxy, topic=topic, namespace=a,
                   bodies=["commit-a", "rollback-a"]).expect_success(60)
    clients.python("send", endpoints=proxy, topic=topic, namespace=b, bodies=["plain-b"]).expect_success(60)
    # An orphan of a: only a's producer (the proxy's group is the topic, in a) is checked.
    orphan = clients.python("orphan", endpoints=proxy, topic=topic, namespace=a, body="orphan-a")
    sent = orphan.wait_event("sent", timeout=60)[0]
    assert orphan.finish(30, close_stdin=False) == -9
    checker_b = clients.python("checker", endpoints=rmq_cluster.proxy_addresses[1], topic=topic, namespace=b)
    checker_a = clients.python("checker", endpoints=rmq_cluster.proxy_addresses[1], topic=topic, namespace=a)
    checked = checker_a.wait_event("checked", timeout=60)[0]
    assert checked["message_id"] == sent["message_id"]
    assert checked["topic"] == topic and checked["namespace"] == a  # stripped on the way out
    checker_a.expect_success(60)
    wait_until(lambda: transaction_of(rmq_cluster, sent["transaction_id"]).state
               == common_pb2.TRANSACTION_STATE_COMMITTED, 30, message="the orphan of a was not committed")
    checker_b.expect_success(60)
    assert checker_b.of("checked") == []

    # The same group name in each namespace.
    group = unique_name("g")
    consumer_a = clients.python("simple", endpoints=proxy, topic=topic, group=group, namespace=a, count=2,
                                await_seconds=1)
    consumer_a.expect_success(60)
    received = consumer_a.of("received")
    assert sorted(m["body"] for m in received) == ["commit-a", "orphan-a"]
    assert {(m["topic"], m["namespace"]) for m in received} == {(topic, a)}
    consumer_b = clients.python("simple", endpoints=proxy, topic=topic, group=group, namespace=b, count=2,
                                await_seconds=1, timeout_seconds=4)
    consumer_b.expect_success(60)
    assert [m["body"] for m in consumer_b.of("received")] == ["plain-b"]
    # The native SDK in each namespace reads the same topics.
    assert sorted(_native(rmq_cluster, a, topic, 2)) == [b"commit-a", b"orphan-a"]
    assert _native(rmq_cluster, b, topic, 1) == [b"plain-b"]


def test_a_bad_or_smuggled_namespace_is_refused_naming_the_field(rmq_cluster: Cluster,
                                                                  unique_name: Callable[[str], str]) -> None:
    """On the wire (what the clients send): a namespace that is not a valid one, in the
    resource or in the header, and a name naming a namespace of its own, are ILLEGAL_TOPIC
    naming the field; nothing is created."""
    import grpc

    from services.proxy.protocol import Code, definition_pb2 as pb, service_pb2 as spb, service_pb2_grpc

    topic = unique_name("nsbad")
    with grpc.insecure_channel(rmq_cluster.proxy_addresses[0]) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        cases = [(pb.Resource(resource_namespace="not.valid", name=topic), [], "topic.resource_namespace"),
                 (pb.Resource(name=topic), [("x-mq-namespace", "not valid")], "topic.resource_namespace"),
                 (pb.Resource(resource_namespace="a", name="b%" + topic), [], "topic.name")]
        for resource, metadata, field in cases:
            response = stub.QueryRoute(spb.QueryRouteRequest(topic=resource), metadata=metadata, timeout=10)
            assert response.status.code == Code.ILLEGAL_TOPIC and field in response.status.message, response
    with txmq.Admin(rmq_cluster.nameserver_address) as admin:
        assert not [t.topic for t in admin.list_topics().topics if topic in t.topic]


def test_the_header_fills_resources_that_name_no_namespace() -> None:
    """What the Node.js client sends: the header alone. Every resource of the request
    without a namespace gets it (nested and repeated ones too); one naming its own keeps it."""
    from services.proxy.convert import resource_name, to_resource
    from services.proxy.namespaces import fill_namespace
    from services.proxy.protocol import definition_pb2 as pb, service_pb2 as spb

    request = spb.AckMessageRequest(group=pb.Resource(name="g"), topic=pb.Resource(resource_namespace="own", name="t"))
    fill_namespace(request, "hdr")
    assert (resource_name(request.group, "group"), resource_name(request.topic, "topic")) == ("hdr%g", "own%t")
    settings = spb.TelemetryCommand(settings=pb.Settings(subscription=pb.Subscription(
        group=pb.Resource(name="g"), subscriptions=[pb.SubscriptionEntry(topic=pb.Resource(name="t"))])))
    fill_namespace(settings, "hdr")
    assert resource_name(settings.settings.subscription.subscriptions[0].topic, "topic") == "hdr%t"
    assert to_resource("hdr%t") == pb.Resource(resource_namespace="hdr", name="t")
    assert to_resource("%DLQ%hdr%g") == pb.Resource(resource_namespace="hdr", name="%DLQ%g")
    assert to_resource("plain") == pb.Resource(name="plain")


@pytest.mark.skipif(node_ready() is not None, reason=node_ready() or "")
def test_node_client_in_two_namespaces(rmq_cluster: Cluster, clients: Clients,
                                       unique_name: Callable[[str], str]) -> None:
    """The Node.js client puts the namespace in the header only for its consumers' and its
    routes' resources: the proxy fills it in, so they reach the namespace's topic too."""
    a, b = _namespaces()
    topic, group = unique_name("nsnode"), unique_name("g")
    proxy = rmq_cluster.proxy_addresses[1]
    clients.node("rmq_node.js", "transactional", endpoints=proxy, topic=topic, namespace=a,
                 bodies=["commit-a", "rollback-a"]).expect_success(60)
    clients.node("rmq_node.js", "send", endpoints=proxy, topic=topic, namespace=b,
                 bodies=["plain-b"]).expect_success(60)
    consumer_a = clients.node("rmq_node.js", "simple", endpoints=proxy, topic=topic, group=group, namespace=a,
                              count=1, await_seconds=1)
    consumer_a.expect_success(60)
    assert [(m["body"], m["topic"]) for m in consumer_a.of("received")] == [("commit-a", topic)]
    consumer_b = clients.node("rmq_node.js", "simple", endpoints=proxy, topic=topic, group=group, namespace=b,
                              count=2, await_seconds=1, timeout_seconds=4)
    consumer_b.expect_success(60)
    assert [m["body"] for m in consumer_b.of("received")] == ["plain-b"]
    # Acknowledged in its namespace: a's group has nothing left, b's message went to b alone.
    again = clients.node("rmq_node.js", "simple", endpoints=proxy, topic=topic, group=group, namespace=a,
                         count=1, await_seconds=1, timeout_seconds=3)
    again.expect_success(60)
    assert again.of("received") == []
    assert _native(rmq_cluster, a, topic, 1) == [b"commit-a"]
    assert _native(rmq_cluster, b, topic, 1) == [b"plain-b"]
