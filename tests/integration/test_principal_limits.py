"""What one authenticated tenant may hold of a service at once over all its connections, on a
real cluster with auth on (``tests.support.ownership``'s principals): open streams, waiting
long polls, pending checks' credit and unary calls in flight. Counted per connection alone,
alice opened one more connection for each stream or long poll the limit refused, and her
slow calls filled the process-wide ``max_concurrent_rpcs`` so every other tenant was shed.

Each test makes alice hold what her per-principal limit allows over several connections (a
channel each, with its own subchannel pool: its own TCP connection), shows the next one
refused with RESOURCE_EXHAUSTED naming the setting and counted on /metrics, bob's calls
going on meanwhile, and alice's share given back when one of hers ends."""

from __future__ import annotations

import queue
from typing import Any, Iterator

import grpc
import pytest

from services.common.auth import ON_BEHALF_OF_HEADER
from tests.support.cluster import Cluster
from tests.support.metrics import metric_sum
from tests.support.ownership import bearer, secured_cluster
from tests.support.waiting import wait_until
from txmq.v1 import (admin_pb2, admin_pb2_grpc, broker_pb2, broker_pb2_grpc, checker_pb2, checker_pb2_grpc,
                     common_pb2, nameserver_pb2, nameserver_pb2_grpc)

pytestmark = pytest.mark.timeout(240)

RPC_TIMEOUT = 10.0
#: The limits here: the broker's streams and long polls, the checker's pending checks, the
#: name server's unary calls in flight, per principal.
STREAMS, LONG_POLLS, PENDING_CHECKS, UNARY = 3, 2, 100, 2
#: alice and bob may create topics of their own prefix (a CreateTopic waits on every broker),
#: and read topics nothing is sent to (a receive of them waits its whole long poll).
ACL = [{"principal": "alice", "resource": "topic:slow-a-*", "actions": ["admin-write"]},
       {"principal": "bob", "resource": "topic:slow-b-*", "actions": ["admin-write"]},
       {"principal": "alice", "resource": "topic:idle-a", "actions": ["subscribe"]},
       {"principal": "bob", "resource": "topic:idle-b", "actions": ["subscribe"]}]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with secured_cluster(tmp_path_factory.mktemp("principal-limits"), extra_acl=ACL,
                         broker_env={"TXMQ_MAX_STREAMS_PER_PRINCIPAL": str(STREAMS),
                                     "TXMQ_MAX_LONG_POLLS_PER_PRINCIPAL": str(LONG_POLLS),
                                     "TXMQ_MAX_LONG_POLLING_SECONDS": "60"},
                         checker_env={"TXMQ_MAX_PENDING_CHECKS_PER_PRINCIPAL": str(PENDING_CHECKS)},
                         nameserver_env={"TXMQ_MAX_CONCURRENT_RPCS_PER_PRINCIPAL": str(UNARY),
                                         "TXMQ_BROKER_RPC_TIMEOUT_SECONDS": "60"}) as cluster:
        for topic in ("na", "nb", "idle-a", "idle-b", "idle"):
            cluster.create_topic(topic, queue_count=1)
        yield cluster


class _Connections:
    """Channels of their own (``grpc.use_local_subchannel_pool``: gRPC shares a connection
    between a process's channels to one address otherwise), closed at the end."""

    def __init__(self) -> None:
        self.channels: list[grpc.Channel] = []

    def new(self, address: str) -> grpc.Channel:
        channel = grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])
        self.channels.append(channel)
        return channel

    def close(self) -> None:
        for channel in self.channels:
            channel.close()


@pytest.fixture
def connections() -> Iterator[_Connections]:
    opened = _Connections()
    try:
        yield opened
    finally:
        opened.close()


def _refusals(port: int, setting: str) -> float:
    return metric_sum(port, "txmq_quota_refusals_total", {"setting": setting})


def _refused_naming(error: grpc.RpcError, setting: str, limit: int, reason: str = "PRINCIPAL_LIMIT") -> None:
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error
    assert f"{setting}={limit}" in (error.details() or "") and "alice" in (error.details() or ""), error.details()
    assert dict(error.trailing_metadata() or ()).get("txmq-reason") == reason


class _Stream:
    """A stream held open until :meth:`close` (its requests come from a queue)."""

    def __init__(self, method: Any, who: str) -> None:
        self._requests: queue.Queue[Any] = queue.Queue()

        def requests() -> Iterator[Any]:
            while (item := self._requests.get()) is not None:
                yield item
        self.call = method(requests(), timeout=120, metadata=bearer(who))

    def send(self, request: Any) -> Any:
        """Sends ``request`` and returns the first response (raises the stream's refusal)."""
        self._requests.put(request)
        return next(self.call)

    def close(self) -> None:
        self._requests.put(None)
        self.call.cancel()


def _produce(connections: _Connections, cluster: Cluster, who: str, topic: str) -> _Stream:
    """A Produce stream of ``who`` on a connection of its own, open once its first send is answered."""
    stub = broker_pb2_grpc.BrokerServiceStub(connections.new(cluster.brokers[0].address))
    stream = _Stream(stub.Produce, who)
    try:
        answer = stream.send(broker_pb2.ProduceRequest(entries=[broker_pb2.ProduceEntry(
            request_id=1, send_message=broker_pb2.SendMessageRequest(message=common_pb2.Message(
                topic=topic, body=b"x", type=common_pb2.MESSAGE_TYPE_NORMAL, queue_id=0)))]))
    except grpc.RpcError:
        stream.close()
        raise
    assert [r.status.code for r in answer.results] == [0], answer
    return stream


def test_a_principals_streams_are_limited_over_all_its_connections(cluster: Cluster,
                                                                   connections: _Connections) -> None:
    """alice holds max_streams_per_principal Produce streams, one per connection (far below
    max_streams_per_connection each); her next, on yet another connection, is refused naming
    the setting, bob's are not, and once one of hers ends she opens another."""
    broker = cluster.brokers[0]
    held = [_produce(connections, cluster, "alice", "na") for _ in range(STREAMS)]
    counted = _refusals(broker.metrics_port, "max_streams_per_principal")
    with pytest.raises(grpc.RpcError) as refused:
        _produce(connections, cluster, "alice", "na")
    _refused_naming(refused.value, "max_streams_per_principal", STREAMS)
    assert _refusals(broker.metrics_port, "max_streams_per_principal") == counted + 1
    bobs = [_produce(connections, cluster, "bob", "nb") for _ in range(STREAMS)]  # bob has his own share
    held.pop().close()

    def reopened() -> bool:
        try:
            held.append(_produce(connections, cluster, "alice", "na"))
        except grpc.RpcError as exc:
            _refused_naming(exc, "max_streams_per_principal", STREAMS)
            return False
        return True
    wait_until(reopened, 30, message="alice's closed stream was never given back")
    for stream in held + bobs:
        stream.close()


def _long_poll(stub: broker_pb2_grpc.BrokerServiceStub, who: str, group: str, topic: str, client_id: str,
               seconds: float, timeout: float) -> Any:
    """A receive of ``who`` (``proxy for alice``: the proxy's identity acting for alice)."""
    service, _, principal = who.partition(" for ")
    metadata = bearer(service) + ([(ON_BEHALF_OF_HEADER, principal)] if principal else [])
    return stub.ReceiveMessages.future(broker_pb2.ReceiveMessagesRequest(
        consumer_group=group, topic=topic, queue_id=-1, max_messages=1, invisible_duration_seconds=30,
        long_polling_timeout_seconds=seconds, client_id=client_id), timeout=timeout, metadata=metadata)


def _waiting(stub: broker_pb2_grpc.BrokerServiceStub, group: str) -> set[str]:
    """The client ids of ``group`` waiting in a long poll on the broker (an internal RPC: a
    service identity's)."""
    clients = stub.DescribeGroupClients(broker_pb2.DescribeGroupClientsRequest(group=group), timeout=RPC_TIMEOUT,
                                        metadata=bearer("nameserver")).clients
    return {c.client_id for c in clients if c.waiting}


def test_a_principals_long_polls_are_limited_over_all_its_connections(cluster: Cluster,
                                                                      connections: _Connections) -> None:
    """alice's max_long_polls_per_principal long polls wait on connections of their own, the
    last one the proxy's for her (a proxy's calls for a principal are that principal's); her
    next is refused at once naming the setting while bob's long poll waits and answers; when
    one of hers ends, her next waits again."""
    address = cluster.brokers[0].address
    stub = lambda: broker_pb2_grpc.BrokerServiceStub(connections.new(address))  # noqa: E731 - a connection each
    held = [_long_poll(stub(), "alice" if i < LONG_POLLS - 1 else "proxy for alice", "ca", "idle-a", f"alice-{i}",
                       55, 58) for i in range(LONG_POLLS)]
    hers = {f"alice-{i}" for i in range(LONG_POLLS)}
    watcher = stub()
    try:
        wait_until(lambda: hers <= _waiting(watcher, "ca"), 30, message="alice's long polls never waited")
        counted = _refusals(cluster.brokers[0].metrics_port, "max_long_polls_per_principal")
        with pytest.raises(grpc.RpcError) as refused:
            _long_poll(stub(), "alice", "ca", "idle-a", "alice-more", 5, RPC_TIMEOUT).result()
        _refused_naming(refused.value, "max_long_polls_per_principal", LONG_POLLS)
        assert _refusals(cluster.brokers[0].metrics_port, "max_long_polls_per_principal") == counted + 1
        bobs = _long_poll(stub(), "bob", "cb", "idle-b", "bob-0", 1, RPC_TIMEOUT)
        assert list(bobs.result().messages) == [], "bob's long poll did not wait and answer"
        held.pop().cancel()
        wait_until(lambda: f"alice-{LONG_POLLS - 1}" not in _waiting(watcher, "ca"), 30,
                   message="alice's cancelled long poll still waits")
        again = _long_poll(stub(), "alice", "ca", "idle-a", "alice-again", 1, RPC_TIMEOUT)
        assert list(again.result().messages) == [], "alice's ended long poll was not given back"
    finally:
        for call in held:
            call.cancel()


def test_a_principals_pending_checks_are_limited_over_all_its_connections(cluster: Cluster,
                                                                          connections: _Connections) -> None:
    """alice's check streams announce credit on connections of their own: beyond
    max_pending_checks_per_principal together the stream is refused naming it (each far below
    max_pending_checks_per_connection); bob's are not; a stream that ends gives its credit back."""
    checker = cluster.checkers[0]
    credit = PENDING_CHECKS // 2

    def subscribe(who: str, group: str, client_id: str) -> _Stream:
        stream = _Stream(checker_pb2_grpc.CheckerServiceStub(connections.new(checker.address)).CheckTransactionState,
                         who)
        try:
            first = stream.send(checker_pb2.CheckTransactionStateRequest(subscribe=checker_pb2.Subscribe(
                producer_groups=[group], client_id=client_id, check_credit=credit)))
        except grpc.RpcError:
            stream.close()
            raise
        assert first.HasField("subscribed"), first
        return stream

    held = [subscribe("alice", "ga", f"alice-{i}") for i in range(PENDING_CHECKS // credit)]
    counted = _refusals(checker.metrics_port, "max_pending_checks_per_principal")
    with pytest.raises(grpc.RpcError) as refused:
        subscribe("alice", "ga", "alice-more")
    _refused_naming(refused.value, "max_pending_checks_per_principal", PENDING_CHECKS)
    assert _refusals(checker.metrics_port, "max_pending_checks_per_principal") == counted + 1
    bobs = [subscribe("bob", "gb", f"bob-{i}") for i in range(PENDING_CHECKS // credit)]
    held.pop().close()

    def reopened() -> bool:
        try:
            held.append(subscribe("alice", "ga", "alice-again"))
        except grpc.RpcError as exc:
            _refused_naming(exc, "max_pending_checks_per_principal", PENDING_CHECKS)
            return False
        return True
    wait_until(reopened, 30, message="alice's ended check stream never gave its credit back")
    for stream in held + bobs:
        stream.close()


def test_a_principals_unary_calls_in_flight_are_its_share_of_the_service(cluster: Cluster,
                                                                          connections: _Connections) -> None:
    """With the broker paused, a CreateTopic waits on it (the name server asks every broker):
    alice's max_concurrent_rpcs_per_principal of them in flight, her next call — any, a quick
    route lookup — is refused at once with the retryable OVERLOADED naming the setting, while
    bob's calls are admitted (his route lookup answered, his CreateTopic waiting with hers).
    Once the broker runs again every waiting call completes and alice's calls are served."""
    nameserver = cluster.nameservers[0]
    address = cluster.nameserver_address
    broker = cluster.brokers[0]
    route = nameserver_pb2.QueryRouteRequest(topic="na")

    def create(who: str, topic: str) -> Any:
        admin = admin_pb2_grpc.AdminServiceStub(connections.new(address))
        return admin.CreateTopic.future(admin_pb2.CreateTopicRequest(topic=topic, queue_count=1), timeout=90,
                                        metadata=bearer(who))

    def lookup(who: str, topic: str) -> nameserver_pb2.QueryRouteResponse:
        stub = nameserver_pb2_grpc.NameServerServiceStub(connections.new(address))
        return stub.QueryRoute(nameserver_pb2.QueryRouteRequest(topic=topic), timeout=RPC_TIMEOUT,
                               metadata=bearer(who))

    def refused() -> bool:
        try:
            lookup("alice", route.topic)
        except grpc.RpcError as exc:
            _refused_naming(exc, "max_concurrent_rpcs_per_principal", UNARY, reason="OVERLOADED")
            return True
        return False

    counted = _refusals(nameserver.metrics_port, "max_concurrent_rpcs_per_principal")
    broker.pause()
    slow: list[Any] = []
    try:
        slow = [create("alice", f"slow-a-{i}") for i in range(UNARY)]

        def full() -> bool:
            """Whether alice's next call is refused: her CreateTopics all wait. One that came
            while a lookup of hers was in flight was refused (nothing created): sent again."""
            for i, call in enumerate(slow):
                if call.done():
                    _refused_naming(call.exception(), "max_concurrent_rpcs_per_principal", UNARY, reason="OVERLOADED")
                    slow[i] = create("alice", f"slow-a-{i}")
            return refused()
        wait_until(full, 30, message="alice's call beyond max_concurrent_rpcs_per_principal was not refused")
        assert _refusals(nameserver.metrics_port, "max_concurrent_rpcs_per_principal") > counted
        assert lookup("bob", "nb").queues, "bob's route lookup was not answered while alice's share was full"
        slow.append(create("bob", "slow-b-0"))
        assert refused(), "alice's share emptied while her calls waited"
    finally:
        broker.resume()
    for call in slow:
        call.result(timeout=90)  # every admitted call completes: bob's was never shed
    wait_until(lambda: not refused(), 30, message="alice's completed calls were never given back")
    assert lookup("alice", "na").queues


def test_service_identities_are_not_held_to_the_tenants_limits(cluster: Cluster, connections: _Connections) -> None:
    """A service identity acting as itself is not counted per principal (its calls are the
    fleet's own work, and every replica of a component shares it): more long polls and streams
    at once than a tenant may hold are served to it. (A proxy's calls for a principal count as
    that principal's: tests/proxy/test_principal_limits.py.)"""
    broker = cluster.brokers[0]
    address = broker.address
    polls = [_long_poll(broker_pb2_grpc.BrokerServiceStub(connections.new(address)), "proxy", "ci", "idle",
                        f"proxy-{i}", 3, RPC_TIMEOUT) for i in range(LONG_POLLS + 2)]
    assert all(list(poll.result().messages) == [] for poll in polls)  # each waited its long poll out
    streams = [_produce(connections, cluster, "proxy", "idle") for _ in range(STREAMS + 2)]
    for stream in streams:
        stream.close()
