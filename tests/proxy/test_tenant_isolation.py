"""Second-pass isolation of the RocketMQ proxy: what a principal with valid credentials for
its own namespace learns of, or does to, resources outside it.

The principal ``stg`` holds the namespace-wide rule the security docs show
(``{namespace: staging, resource: cluster, actions: [publish, subscribe]}``): every topic and
group of ``staging``, nothing outside it."""

from __future__ import annotations

import threading
import time
from typing import Any, Iterator

import grpc
import pytest
from google.protobuf import duration_pb2

from services.proxy.protocol import Code, definition_pb2 as pb, service_pb2 as spb, service_pb2_grpc
from tests.support.cluster import Cluster
from tests.support.ownership import secured_cluster, signed
from tests.support.waiting import wait_until
from txmq.v1 import admin_pb2, common_pb2

pytestmark = pytest.mark.timeout(180)

RPC_TIMEOUT = 10.0
STAGING = [{"principal": "stg", "namespace": "staging", "resource": "cluster", "actions": ["publish", "subscribe"]}]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cluster = secured_cluster(tmp_path_factory.mktemp("tenant-isolation"), extra_acl=STAGING, extra_rmq=("stg",))
    try:
        admin = cluster.admin_stub()
        # Another tenant's FIFO topic outside the namespace, and a FIFO topic of staging's own.
        for topic in ("prodfifo", "staging%sfifo"):
            admin.CreateTopic(admin_pb2.CreateTopicRequest(topic=topic, queue_count=1,
                                                           topic_type=common_pb2.TOPIC_TYPE_FIFO), timeout=RPC_TIMEOUT)
            cluster.wait_route(topic, 1)
        yield cluster
    finally:
        cluster.stop()


def _settings_reply(channel: grpc.Channel, who: str, topic: pb.Resource) -> spb.TelemetryCommand:
    """The proxy's reply to a push consumer's Settings subscribing to ``topic``."""
    settings = pb.Settings(client_type=pb.PUSH_CONSUMER, subscription=pb.Subscription(
        group=pb.Resource(resource_namespace="staging", name="g"),
        subscriptions=[pb.SubscriptionEntry(topic=topic, expression=pb.FilterExpression(type=pb.TAG,
                                                                                        expression="*"))]))

    def requests() -> Iterator[spb.TelemetryCommand]:
        yield spb.TelemetryCommand(settings=settings)
        time.sleep(RPC_TIMEOUT)  # open until the reply came (the call is cancelled then)

    call = service_pb2_grpc.MessagingServiceStub(channel).Telemetry(
        requests(), timeout=RPC_TIMEOUT, metadata=signed(who, f"{who}-{time.monotonic_ns()}"))
    try:
        for reply in call:
            if reply.HasField("settings") or reply.status.code != Code.OK:
                return reply
        raise AssertionError("the Telemetry stream ended without a reply")
    finally:
        call.cancel()


def test_settings_reveal_nothing_of_a_topic_outside_the_namespace(cluster: Cluster) -> None:
    """A consumer's Settings reply says whether its subscriptions are FIFO. It must be about
    the topics the consumer named — ``staging%<name>`` — never about a topic of the same name
    outside the namespace, which the principal holds no right on (the proxy looked that one up
    as its own service identity: ``prodfifo`` answered FIFO, ``staging%sfifo`` did not)."""
    channel = grpc.insecure_channel(cluster.proxy_addresses[0])
    try:
        probe = _settings_reply(channel, "stg", pb.Resource(resource_namespace="staging", name="prodfifo"))
        assert probe.status.code == Code.OK, probe.status
        assert not probe.settings.subscription.fifo, "staging%prodfifo does not exist: the reply told of prodfifo"
        own = _settings_reply(channel, "stg", pb.Resource(resource_namespace="staging", name="sfifo"))
        assert own.status.code == Code.OK, own.status
        assert own.settings.subscription.fifo, "staging%sfifo is FIFO"
    finally:
        channel.close()


@pytest.fixture(scope="module")
def auto_creating(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Topics created on a producer's first route (``auto_create_topics``), none created yet."""
    with secured_cluster(tmp_path_factory.mktemp("tenant-autocreate"), auto_create_topics=True) as cluster:
        yield cluster


def _topics(cluster: Cluster) -> set[str]:
    return {t.topic for t in cluster.admin_stub().ListTopics(admin_pb2.ListTopicsRequest(), timeout=RPC_TIMEOUT).topics}


def test_only_a_publisher_creates_a_topic_by_routing_to_it(auto_creating: Cluster) -> None:
    """Auto-creation is a producer's: ``reader`` (natively) and ``rowner`` (through the proxy)
    may subscribe to ``ta``/``tb`` but not publish there. Their route lookups, receives and
    assignments of a missing topic answer TOPIC_NOT_FOUND and create nothing (the proxy's
    lookups, made as its own identity, created it for them; the name server did natively for
    any for_send lookup). A publisher's first route still creates its topic."""
    from tests.support.ownership import bearer
    from txmq.v1 import nameserver_pb2, nameserver_pb2_grpc

    cluster = auto_creating
    ns = grpc.insecure_channel(cluster.nameserver_addresses[0])
    proxy = grpc.insecure_channel(cluster.proxy_addresses[0])
    try:
        names = nameserver_pb2_grpc.NameServerServiceStub(ns)
        with pytest.raises(grpc.RpcError) as refused:
            names.QueryRoute(nameserver_pb2.QueryRouteRequest(topic="ta", for_send=True), timeout=RPC_TIMEOUT,
                             metadata=bearer("reader"))
        assert refused.value.code() == grpc.StatusCode.NOT_FOUND, refused.value
        rmq = service_pb2_grpc.MessagingServiceStub(proxy)
        tb, group = pb.Resource(name="tb"), pb.Resource(name="rcs")
        route = rmq.QueryRoute(spb.QueryRouteRequest(topic=tb), timeout=RPC_TIMEOUT, metadata=signed("rowner"))
        assignment = rmq.QueryAssignment(spb.QueryAssignmentRequest(topic=tb, group=group), timeout=RPC_TIMEOUT,
                                         metadata=signed("rowner"))
        frames = list(rmq.ReceiveMessage(spb.ReceiveMessageRequest(
            group=group, message_queue=pb.MessageQueue(topic=tb, id=-1), batch_size=1,
            filter_expression=pb.FilterExpression(type=pb.TAG, expression="*")),
            timeout=RPC_TIMEOUT, metadata=signed("rowner")))
        codes = {"QueryRoute": route.status.code, "QueryAssignment": assignment.status.code,
                 "ReceiveMessage": frames[0].status.code}
        assert codes == dict.fromkeys(codes, Code.TOPIC_NOT_FOUND), codes
        assert not {"ta", "tb"} & _topics(cluster), "a subscriber's lookup created a topic"

        # Publishers: natively and through the proxy, their first route creates the topic.
        names.QueryRoute(nameserver_pb2.QueryRouteRequest(topic="na", for_send=True), timeout=RPC_TIMEOUT,
                         metadata=bearer("alice"))
        created = rmq.QueryRoute(spb.QueryRouteRequest(topic=pb.Resource(name="ra")), timeout=RPC_TIMEOUT,
                                 metadata=signed("rma"))
        assert created.status.code == Code.OK, created.status
        assert {"na", "ra"} <= _topics(cluster)
    finally:
        ns.close()
        proxy.close()


@pytest.fixture(scope="module")
def small_shares(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The broker takes 2 long polls per connection, the checker 64 checks' credit (two of the
    proxy's check subscriptions, 32 each) per connection: the proxy reaches both over one."""
    cluster = secured_cluster(tmp_path_factory.mktemp("tenant-shares"),
                              broker_env={"TXMQ_MAX_LONG_POLLS_PER_CONNECTION": "2"},
                              checker_env={"TXMQ_MAX_PENDING_CHECKS_PER_CONNECTION": "64"})
    try:
        for topic in ("ta", "tb", "ra", "rb"):
            cluster.create_topic(topic, queue_count=1)
        yield cluster
    finally:
        cluster.stop()


class _Producer:
    """A RocketMQ producer's Telemetry stream, open (its Settings publish ``topic``) until closed."""

    def __init__(self, channel: grpc.Channel, who: str, client_id: str, topic: str) -> None:
        self._done = threading.Event()
        settings = pb.Settings(client_type=pb.PRODUCER, publishing=pb.Publishing(topics=[pb.Resource(name=topic)]))

        def requests() -> Iterator[spb.TelemetryCommand]:
            yield spb.TelemetryCommand(settings=settings)
            self._done.wait(120)

        self._call = service_pb2_grpc.MessagingServiceStub(channel).Telemetry(
            requests(), timeout=150, metadata=signed(who, client_id))
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        try:
            for _ in self._call:
                pass
        except grpc.RpcError:
            pass

    def close(self) -> None:
        self._done.set()
        self._call.cancel()
        self._reader.join(30)


def test_one_tenant_spends_only_its_own_share_of_the_proxys_connections(small_shares: Cluster) -> None:
    """The proxy carries every tenant's long polls to a broker and every producer's check
    subscription to a checker over one connection each, and those services limit what one
    connection holds. Counted per connection alone, one tenant filled it: rowner's two long
    polls made the broker refuse rreader's receive (TOO_MANY_REQUESTS), rma's two producers
    left rmb's producer without a check subscription (its orphans never checked). Counted per
    connection and the principal the proxy acts for, each tenant has its own share."""
    from tests.support.metrics import metric_sum
    from tests.support.ownership import bearer
    from txmq.v1 import broker_pb2, broker_pb2_grpc

    cluster = small_shares
    proxy = grpc.insecure_channel(cluster.proxy_addresses[0])
    broker = grpc.insecure_channel(cluster.brokers[0].address)
    rmq = service_pb2_grpc.MessagingServiceStub(proxy)
    producers: list[_Producer] = []

    def receive(who: str, topic: str, client_id: str, wait: int) -> Any:
        """The ReceiveMessage call (under way once made; its frames as it is iterated)."""
        return rmq.ReceiveMessage(spb.ReceiveMessageRequest(
            group=pb.Resource(name="rcs"), message_queue=pb.MessageQueue(topic=pb.Resource(name=topic), id=-1),
            filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"), batch_size=1,
            long_polling_timeout=duration_pb2.Duration(seconds=wait)),
            timeout=wait + 30, metadata=signed(who, client_id))

    def waiting() -> int:
        clients = broker_pb2_grpc.BrokerServiceStub(broker).DescribeGroupClients(
            broker_pb2.DescribeGroupClientsRequest(group="rcs"), timeout=RPC_TIMEOUT, metadata=bearer("nameserver"))
        return sum(c.waiting for c in clients.clients if c.client_id.startswith("rowner-poll"))

    polls = [receive("rowner", "tb", f"rowner-poll-{i}", 25) for i in range(2)]
    try:
        wait_until(lambda: waiting() == 2, 30, message="rowner's long polls never waited on the broker")
        frames = list(receive("rreader", "ta", "rreader-1", 1))
        assert waiting() == 2, "rowner's long polls ended early (a loaded machine): nothing was shown"
        assert frames[0].status.code == Code.MESSAGE_NOT_FOUND, frames[0].status

        checker_metrics = cluster.checkers[0].metrics_port
        producers += [_Producer(proxy, "rma", f"rma-{i}", "ra") for i in range(2)]
        wait_until(lambda: metric_sum(checker_metrics, "txmq_producers_connected", {"group": "ra"}) == 2, 30,
                   message="rma's producers were never subscribed")
        producers.append(_Producer(proxy, "rmb", "rmb-1", "rb"))
        wait_until(lambda: metric_sum(checker_metrics, "txmq_producers_connected", {"group": "rb"}) == 1, 30,
                   message="rmb's producer never got a check subscription: rma's took the proxy's share")
    finally:
        for producer in producers:
            producer.close()
        for poll in polls:
            poll.cancel()
        proxy.close()
        broker.close()


def test_a_request_of_a_million_entries_is_refused_before_any_work(cluster: Cluster) -> None:
    """The policy is decided on the proxy's one event loop, per entry of a request: a 3 MB
    Settings naming ``ra`` 500,000 times held the loop (every tenant's calls on the replica)
    for about ten seconds, and one SendMessage of a million tiny messages alike. A request
    listing more entries than any client sends is refused naming the field, before the policy
    looks at them (in band: BAD_REQUEST; a Telemetry stream ends INVALID_ARGUMENT)."""
    from services.proxy.access import MAX_ENTRIES

    channel = grpc.insecure_channel(cluster.proxy_addresses[0])
    try:
        rmq = service_pb2_grpc.MessagingServiceStub(channel)
        too_many = MAX_ENTRIES + 1
        settings = pb.Settings(client_type=pb.PRODUCER, publishing=pb.Publishing(
            topics=[pb.Resource(name="ra")] * too_many))

        def requests() -> Iterator[spb.TelemetryCommand]:
            yield spb.TelemetryCommand(settings=settings)
            time.sleep(RPC_TIMEOUT)

        with pytest.raises(grpc.RpcError) as ended:
            for reply in rmq.Telemetry(requests(), timeout=RPC_TIMEOUT, metadata=signed("rma", "rma-many")):
                assert not reply.HasField("settings"), "a Settings of too many topics was answered"
        assert ended.value.code() == grpc.StatusCode.INVALID_ARGUMENT, ended.value
        assert "settings.publishing.topics" in ended.value.details(), ended.value.details()

        message = pb.Message(topic=pb.Resource(name="ra"), body=b"x", system_properties=pb.SystemProperties(
            message_id="m", message_type=pb.NORMAL))
        sent = rmq.SendMessage(spb.SendMessageRequest(messages=[message] * too_many), timeout=RPC_TIMEOUT,
                               metadata=signed("rma"))
        assert sent.status.code == Code.BAD_REQUEST and "messages" in sent.status.message, sent.status
        acked = rmq.AckMessage(spb.AckMessageRequest(
            group=pb.Resource(name="rcs"), topic=pb.Resource(name="ta"),
            entries=[spb.AckMessageEntry(message_id="m", receipt_handle="h")] * too_many),
            timeout=RPC_TIMEOUT, metadata=signed("rreader"))
        assert acked.status.code == Code.BAD_REQUEST and "entries" in acked.status.message, acked.status
    finally:
        channel.close()


def _rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_a_client_that_left_leaves_no_big_settings_behind(cluster: Cluster) -> None:
    """The proxy remembers a client for client_idle_expiry_seconds (600 s) after its last
    Telemetry stream ends. It kept the client's whole last Settings, which nothing reads: one
    tenant sending 4 MB Settings (a long user_agent.hostname) under ever new client ids
    made the proxy hold 4 MB per id for ten minutes (80 ids: 390 MB of RSS)."""
    proxy = cluster.proxies[0]
    pid = proxy.pid
    assert pid is not None
    channel = grpc.insecure_channel(cluster.proxy_addresses[0], options=[
        ("grpc.max_send_message_length", 8 << 20), ("grpc.max_receive_message_length", 8 << 20)])
    rmq = service_pb2_grpc.MessagingServiceStub(channel)
    big = pb.Settings(client_type=pb.PRODUCER, publishing=pb.Publishing(topics=[pb.Resource(name="ra")]),
                      user_agent=pb.UA(hostname="h" * (4 << 20)))

    def one(client_id: str) -> None:
        def requests() -> Iterator[spb.TelemetryCommand]:
            yield spb.TelemetryCommand(settings=big)
            time.sleep(RPC_TIMEOUT)

        call = rmq.Telemetry(requests(), timeout=RPC_TIMEOUT, metadata=signed("rma", client_id))
        try:
            for reply in call:
                if reply.HasField("settings"):
                    return
        finally:
            call.cancel()

    try:
        one("rma-warm-up")
        before = _rss_bytes(pid)
        for i in range(80):
            one(f"rma-big-{i}")
        grown = _rss_bytes(pid) - before
        # Kept, they are some 390 MiB; what the proxy's heap keeps anyway stays near 40 MiB.
        assert grown < 160 << 20, f"the proxy grew {grown >> 20} MiB holding 80 departed clients' Settings"
    finally:
        channel.close()


@pytest.fixture(scope="module")
def few_renewals(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A proxy that renews at most 3 deliveries per principal."""
    with secured_cluster(tmp_path_factory.mktemp("tenant-renewals"),
                         proxy_env={"TXMQ_MAX_RENEWALS_PER_PRINCIPAL": "3"}) as cluster:
        for topic in ("ta", "tb"):
            cluster.create_topic(topic, queue_count=1)
        yield cluster


def test_one_principal_holds_at_most_its_share_of_auto_renewed_deliveries(few_renewals: Cluster) -> None:
    """Each auto-renewed delivery costs the proxy a broker call every half invisibility (0.5 s
    at the shortest) until acked, for up to auto_renew_max_seconds, all on its one loop: a
    tenant receiving its own backlog with auto_renew and never acking made the proxy renew
    without bound, for every tenant's loss. Beyond max_renewals_per_principal a push receive
    takes no more (TOO_MANY_REQUESTS, nothing delivered); another principal's are unaffected."""
    from tests.support.ownership import Census, Native

    cluster = few_renewals
    native = Native(cluster, Census())
    channel = grpc.insecure_channel(cluster.proxy_addresses[0])
    rmq = service_pb2_grpc.MessagingServiceStub(channel)

    def push_receive(who: str, topic: str) -> list[spb.ReceiveMessageResponse]:
        request = spb.ReceiveMessageRequest(
            group=pb.Resource(name="rcs"), message_queue=pb.MessageQueue(topic=pb.Resource(name=topic), id=-1),
            filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"), batch_size=32, auto_renew=True,
            long_polling_timeout=duration_pb2.Duration(seconds=1))
        return list(rmq.ReceiveMessage(request, timeout=RPC_TIMEOUT, metadata=signed(who, f"{who}-push")))

    try:
        for _ in range(5):
            native.normal("owner", "tb")
            native.normal("owner", "ta")
        got: list[pb.Message] = []
        deadline = time.monotonic() + 30
        while len(got) < 3 and time.monotonic() < deadline:
            got += [f.message for f in push_receive("rowner", "tb") if f.HasField("message")]
        assert len(got) == 3, f"rowner received {len(got)} deliveries, its share is 3"
        refused = push_receive("rowner", "tb")
        assert refused[0].status.code == Code.TOO_MANY_REQUESTS, refused[0].status
        assert "max_renewals_per_principal" in refused[0].status.message
        assert not any(f.HasField("message") for f in refused)
        other = [f.message for f in push_receive("rreader", "ta") if f.HasField("message")]
        assert other, "rreader's share was spent by rowner"
    finally:
        native.close()
        channel.close()


#: rq, a RocketMQ client, may make up consumer groups rq-* and topics rt*.
PREFIXED = [{"principal": "rq", "resource": "consumer_group:rq-*", "actions": ["subscribe"]},
            {"principal": "rq", "resource": "topic:rt*", "actions": ["publish", "subscribe"]}]


@pytest.fixture(scope="module")
def small_quotas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Two consumer groups per principal on the broker, two topics on the name server."""
    with secured_cluster(tmp_path_factory.mktemp("tenant-quotas"), extra_acl=PREFIXED, extra_rmq=("rq",),
                         auto_create_topics=True, broker_env={"TXMQ_MAX_CONSUMER_GROUPS_PER_PRINCIPAL": "2"},
                         nameserver_env={"TXMQ_MAX_TOPICS_PER_PRINCIPAL": "2"}) as cluster:
        cluster.create_topic("rt", queue_count=1)  # the operator's, yet rt* covers it: counted
        yield cluster


def test_a_proxied_client_is_held_to_its_own_quotas(small_quotas: Cluster) -> None:
    """The proxy makes its clients' calls as its own service identity, which no quota counts.
    The brokers count what they create for the principal the proxy acts for: rq's third new
    consumer group is refused (TOO_MANY_REQUESTS naming the setting). And the lookup that
    auto-creates a topic, which the proxy made as itself (so rq created topics without
    bound), names rq to the name server: its topic beyond the quota is refused alike."""
    channel = grpc.insecure_channel(small_quotas.proxy_addresses[0])
    rmq = service_pb2_grpc.MessagingServiceStub(channel)

    def receive(group: str) -> spb.ReceiveMessageResponse:
        return list(rmq.ReceiveMessage(spb.ReceiveMessageRequest(
            group=pb.Resource(name=group), message_queue=pb.MessageQueue(topic=pb.Resource(name="rt"), id=-1),
            filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"), batch_size=1,
            long_polling_timeout=duration_pb2.Duration(seconds=1)),
            timeout=RPC_TIMEOUT, metadata=signed("rq", "rq-consumer")))[0]

    def route(topic: str) -> spb.QueryRouteResponse:
        return rmq.QueryRoute(spb.QueryRouteRequest(topic=pb.Resource(name=topic)), timeout=RPC_TIMEOUT,
                              metadata=signed("rq", "rq-producer"))

    try:
        for group in ("rq-0", "rq-1"):
            assert receive(group).status.code in (Code.OK, Code.MESSAGE_NOT_FOUND), group
        refused = receive("rq-2").status
        assert refused.code == Code.TOO_MANY_REQUESTS and "max_consumer_groups_per_principal=2" in refused.message, \
            refused
        assert receive("rq-0").status.code in (Code.OK, Code.MESSAGE_NOT_FOUND)

        assert route("rt-a").status.code == Code.OK  # auto-created: rt and rt-a
        refused = route("rt-b").status
        assert refused.code == Code.TOO_MANY_REQUESTS and "max_topics_per_principal=2" in refused.message, refused
        assert "rt-b" not in _topics(small_quotas)
    finally:
        channel.close()
