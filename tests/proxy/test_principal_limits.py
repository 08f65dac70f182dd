"""What one RocketMQ principal may hold of a proxy at once over all its connections, on real
services with auth on: live clients (an open Telemetry stream each, which costs a check
subscription on every checker) and waiting long polls. Client ids and connections are the
clients' to multiply: counted per connection alone, one principal held as many clients and
long polls as it opened connections. Beyond ``max_live_clients_per_principal`` a Telemetry
stream is answered 42900 TOO_MANY_REQUESTS in band, naming the setting, with nothing
remembered; beyond ``max_long_polls_per_principal`` a ReceiveMessage is."""

from __future__ import annotations

import threading
import time
from typing import Any, Iterator

import grpc
import pytest
from google.protobuf import duration_pb2

from services.proxy.protocol import Code, definition_pb2 as pb, service_pb2 as spb, service_pb2_grpc
from tests.support.cluster import Cluster
from tests.support.metrics import metric_sum
from tests.support.ownership import bearer, secured_cluster, signed
from tests.support.waiting import wait_until
from txmq.v1 import broker_pb2, broker_pb2_grpc

pytestmark = pytest.mark.timeout(180)

RPC_TIMEOUT = 10.0
#: The proxy's max_live_clients_per_principal and max_long_polls_per_principal here.
LIVE, LONG_POLLS = 3, 2


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with secured_cluster(tmp_path_factory.mktemp("proxy-principal-limits"),
                         proxy_env={"TXMQ_MAX_LIVE_CLIENTS_PER_PRINCIPAL": str(LIVE),
                                    "TXMQ_MAX_LONG_POLLS_PER_PRINCIPAL": str(LONG_POLLS)}) as cluster:
        for topic in ("ra", "rb", "ta", "tb"):
            cluster.create_topic(topic, queue_count=1)
        yield cluster


class _Connections:
    """Channels of their own (``grpc.use_local_subchannel_pool``: gRPC shares a connection
    between a process's channels to one address otherwise), closed at the end."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.channels: list[grpc.Channel] = []

    def stub(self) -> service_pb2_grpc.MessagingServiceStub:
        channel = grpc.insecure_channel(self.address, options=[("grpc.use_local_subchannel_pool", 1)])
        self.channels.append(channel)
        return service_pb2_grpc.MessagingServiceStub(channel)

    def close(self) -> None:
        for channel in self.channels:
            channel.close()


@pytest.fixture
def connections(cluster: Cluster) -> Iterator[_Connections]:
    opened = _Connections(cluster.proxy_addresses[0])
    try:
        yield opened
    finally:
        opened.close()


class _Producer:
    """A producer's Telemetry stream on a connection of its own: its Settings publish
    ``topic``; open until :meth:`close`. ``first`` is the proxy's first reply."""

    def __init__(self, connections: _Connections, who: str, client_id: str, topic: str) -> None:
        self._done = threading.Event()
        settings = pb.Settings(client_type=pb.PRODUCER, publishing=pb.Publishing(topics=[pb.Resource(name=topic)]))

        def requests() -> Iterator[spb.TelemetryCommand]:
            yield spb.TelemetryCommand(settings=settings)
            self._done.wait(120)

        self._call = connections.stub().Telemetry(requests(), timeout=150, metadata=signed(who, client_id))
        self.first: spb.TelemetryCommand = next(self._call)

    @property
    def live(self) -> bool:
        return self.first.status.code == Code.OK and self.first.HasField("settings")

    def close(self) -> None:
        self._done.set()
        self._call.cancel()


def _remembered(cluster: Cluster, state: str) -> float:
    return metric_sum(cluster.proxies[0].metrics_port, "txmq_proxy_clients", {"state": state})


def _refusals(cluster: Cluster, setting: str) -> float:
    return metric_sum(cluster.proxies[0].metrics_port, "txmq_quota_refusals_total", {"setting": setting})


def test_a_principals_live_clients_are_limited_over_all_its_connections(cluster: Cluster,
                                                                        connections: _Connections) -> None:
    """rma's LIVE producers, each its own client id on its own connection, are live; the next
    one (a new id, a new connection) is answered TOO_MANY_REQUESTS naming the setting and is
    not remembered; rmb's producer is live meanwhile; once one of rma's leaves, rma's next is
    live again."""
    producers = [_Producer(connections, "rma", f"rma-{i}", "ra") for i in range(LIVE)]
    try:
        assert all(p.live for p in producers), [p.first for p in producers]
        counted = _refusals(cluster, "max_live_clients_per_principal")
        refused = _Producer(connections, "rma", "rma-more", "ra")
        producers.append(refused)
        assert refused.first.status.code == Code.TOO_MANY_REQUESTS, refused.first
        assert f"max_live_clients_per_principal={LIVE}" in refused.first.status.message, refused.first.status
        assert _refusals(cluster, "max_live_clients_per_principal") == counted + 1
        rmb = _Producer(connections, "rmb", "rmb-0", "rb")
        producers.append(rmb)
        assert rmb.live, rmb.first
        wait_until(lambda: _remembered(cluster, "live") == LIVE + 1, 30,
                   message=lambda: f"the proxy remembers {_remembered(cluster, 'live')} live clients, not rma's "
                                   f"{LIVE} and rmb's (the refused one is remembered)")
        assert _remembered(cluster, "departed") == 0, "the refused client is remembered"
        producers[0].close()

        def again() -> bool:
            producer = _Producer(connections, "rma", "rma-again", "ra")
            producers.append(producer)
            if not producer.live:
                assert producer.first.status.code == Code.TOO_MANY_REQUESTS, producer.first
                producer.close()
            return producer.live
        wait_until(again, 30, message="rma's departed client never gave its place back")
    finally:
        for producer in producers:
            producer.close()


def test_a_principals_long_polls_are_limited_over_all_its_connections_in_band(
        cluster: Cluster, connections: _Connections) -> None:
    """rowner's LONG_POLLS receives wait (relayed to the broker) on connections of their own;
    the next is answered TOO_MANY_REQUESTS naming max_long_polls_per_principal at once, while
    rreader's receive waits and answers; once one of rowner's ends, its next waits again."""
    broker = grpc.insecure_channel(cluster.brokers[0].address)

    def receive(who: str, topic: str, client_id: str, wait: int) -> Any:
        return connections.stub().ReceiveMessage(spb.ReceiveMessageRequest(
            group=pb.Resource(name="rcs"), message_queue=pb.MessageQueue(topic=pb.Resource(name=topic), id=-1),
            filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"), batch_size=1,
            long_polling_timeout=duration_pb2.Duration(seconds=wait)), timeout=wait + 30,
            metadata=signed(who, client_id))

    def waiting() -> set[str]:
        clients = broker_pb2_grpc.BrokerServiceStub(broker).DescribeGroupClients(
            broker_pb2.DescribeGroupClientsRequest(group="rcs"), timeout=RPC_TIMEOUT, metadata=bearer("nameserver"))
        return {c.client_id for c in clients.clients if c.waiting}

    def statuses(call: Any) -> list[pb.Status]:
        return [frame.status for frame in call if frame.HasField("status")]

    polls = [receive("rowner", "tb", f"rowner-poll-{i}", 25) for i in range(LONG_POLLS)]
    try:
        wait_until(lambda: {f"rowner-poll-{i}" for i in range(LONG_POLLS)} <= waiting(), 30,
                   message="rowner's long polls never waited on the broker")
        counted = _refusals(cluster, "max_long_polls_per_principal")
        refused = statuses(receive("rowner", "tb", "rowner-more", 5))
        assert [s.code for s in refused] == [Code.TOO_MANY_REQUESTS], refused
        assert f"max_long_polls_per_principal={LONG_POLLS}" in refused[0].message, refused[0]
        assert _refusals(cluster, "max_long_polls_per_principal") == counted + 1
        started = time.monotonic()
        assert [s.code for s in statuses(receive("rreader", "ta", "rreader-0", 1))] == [Code.MESSAGE_NOT_FOUND]
        assert time.monotonic() - started >= 0.5, "rreader's receive did not wait"
        polls.pop().cancel()
        wait_until(lambda: f"rowner-poll-{LONG_POLLS - 1}" not in waiting(), 30,
                   message="rowner's cancelled long poll still waits")
        assert [s.code for s in statuses(receive("rowner", "tb", "rowner-again", 1))] == [Code.MESSAGE_NOT_FOUND]
    finally:
        for poll in polls:
            poll.cancel()
        broker.close()

