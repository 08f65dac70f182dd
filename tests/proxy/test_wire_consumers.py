"""Consumer RPCs on the wire (generated modules, as in test_replicas): dead-lettering on
request (ForwardMessageToDeadLetterQueue, which only FIFO clients call), the end of a push
delivery's auto renewal (nack, client termination), and the brokers' limits in Settings."""

from __future__ import annotations

import uuid
from typing import Callable

from google.protobuf import duration_pb2
import pytest

import txmq
from services.proxy.protocol import definition_pb2 as pb, service_pb2 as spb
from tests.support.cluster import Cluster
from tests.support.metrics import metric_sum
from tests.support.processes import ServiceProcess
from tests.support.waiting import wait_until
from txmq.ids import ReceiptHandle

from .test_replicas import Telemetry, stub

pytestmark = pytest.mark.timeout(120)


def send_normal(address: str, topic: str, body: bytes) -> str:
    m = pb.Message(topic=pb.Resource(name=topic), body=body)
    m.system_properties.message_id = uuid.uuid4().hex.upper()
    m.system_properties.message_type = pb.NORMAL
    m.system_properties.body_encoding = pb.IDENTITY
    response = stub(address).SendMessage(spb.SendMessageRequest(messages=[m]), timeout=10)
    assert response.status.code == pb.OK, response.status
    return m.system_properties.message_id


def receive(address: str, group: str, topic: str, *, client_id: str = "wire-consumer", wait: float = 3.0,
            invisible: float | None = None, auto_renew: bool = False) -> tuple[int, list[pb.Message]]:
    request = spb.ReceiveMessageRequest(
        group=pb.Resource(name=group), message_queue=pb.MessageQueue(topic=pb.Resource(name=topic), id=-1),
        filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"), batch_size=16,
        long_polling_timeout=duration_pb2.Duration(seconds=int(wait)), auto_renew=auto_renew)
    if invisible is not None:
        request.invisible_duration.FromMilliseconds(int(invisible * 1000))
    frames = list(stub(address).ReceiveMessage(request, timeout=wait + 5,
                                               metadata=[("x-mq-client-id", client_id)]))
    statuses = [f.status.code for f in frames if f.HasField("status")]
    assert len(statuses) == 1, frames
    return statuses[0], [f.message for f in frames if f.HasField("message")]


def receive_one(address: str, group: str, topic: str, **kwargs: object) -> pb.Message:
    def got() -> list[pb.Message]:
        return receive(address, group, topic, **kwargs)[1]  # type: ignore[arg-type]
    [message] = wait_until(got, 30, message=f"a delivery from {topic}")
    return message


def forward(address: str, group: str, topic: str, handle: str) -> pb.Status:
    return stub(address).ForwardMessageToDeadLetterQueue(spb.ForwardMessageToDeadLetterQueueRequest(
        group=pb.Resource(name=group), topic=pb.Resource(name=topic), receipt_handle=handle,
        message_id="unused", delivery_attempt=1, max_delivery_attempts=16), timeout=10).status


def ack(address: str, group: str, topic: str, message: pb.Message, handle: str | None = None) -> pb.Status:
    return stub(address).AckMessage(spb.AckMessageRequest(
        group=pb.Resource(name=group), topic=pb.Resource(name=topic), entries=[spb.AckMessageEntry(
            message_id=message.system_properties.message_id,
            receipt_handle=handle or message.system_properties.receipt_handle)]), timeout=10).status


def test_forward_message_to_dead_letter_queue(rmq_cluster: Cluster, unique_name: Callable[[str], str]) -> None:
    first, second = rmq_cluster.proxy_addresses[:2]  # the two replicas (renewing_proxy may be a third)
    topic, group = unique_name("fwd"), unique_name("g")
    message_id = send_normal(first, topic, b"give-up")
    delivered = receive_one(first, group, topic, invisible=1.0)
    handle = delivered.system_properties.receipt_handle
    assert delivered.system_properties.message_id == message_id

    # Through the other replica: the handle names its broker.
    status = forward(second, group, topic, handle)
    assert status.code == pb.OK, status
    # It is gone from the group: the same handle again, or an ack with it, is stale.
    assert forward(first, group, topic, handle).code == pb.INVALID_RECEIPT_HANDLE
    assert ack(first, group, topic, delivered).code == pb.INVALID_RECEIPT_HANDLE
    # Mangled, foreign-store and empty handles.
    assert forward(first, group, topic, "bogus").code == pb.INVALID_RECEIPT_HANDLE
    decoded = ReceiptHandle.decode(handle)
    foreign = ReceiptHandle(decoded.broker, decoded.store_id + 1, decoded.topic, decoded.queue_id,
                            decoded.offset, decoded.attempt).encode()
    assert forward(first, group, topic, foreign).code == pb.INVALID_RECEIPT_HANDLE
    assert forward(first, group, topic, "").code == pb.INVALID_RECEIPT_HANDLE
    # Not redelivered to the group after its invisibility (1 s) ran out: the long poll
    # outlasts it and finds nothing.
    code, messages = receive(first, group, topic, wait=3.0)
    assert code == pb.MESSAGE_NOT_FOUND and messages == []

    # It is in the group's dead-letter topic, as it was sent.
    with txmq.SimpleConsumer(rmq_cluster.nameserver_address, consumer_group=unique_name("dlq"),
                             subscriptions={f"%DLQ%{group}": "*"}, await_duration_seconds=1.0) as consumer:
        [dead] = wait_until(lambda: consumer.receive(16, 10.0), 30, message="the dead-lettered message",
                            ignore=(txmq.TopicNotFoundError,))
    assert dead.message_id == message_id and dead.body == b"give-up"


def test_auto_renew_ends_on_nack_and_on_client_termination(
        rmq_cluster: Cluster, renewing_proxy: ServiceProcess, unique_name: Callable[[str], str]) -> None:
    """On the proxy whose deliveries are invisible 1 s: a renewed delivery stays invisible;
    a nack (with the handle the client got) ends the renewal, and so does the client's
    NotifyClientTermination; each time the message comes back, attempt + 1."""
    proxy, port = renewing_proxy.address, renewing_proxy.metrics_port
    topic, group = unique_name("renewwire"), unique_name("g")
    send_normal(proxy, topic, b"renew-me")

    def renewals() -> float:
        return metric_sum(port, "txmq_proxy_renewals_total", {"result": "ok"})

    first = receive_one(proxy, group, topic, client_id="client-a", auto_renew=True)
    assert first.system_properties.delivery_attempt == 1
    before = renewals()
    wait_until(lambda: renewals() >= before + 3, 20, message="three renewals")  # 1.5 s: past 1 s
    code, messages = receive(proxy, group, topic, client_id="client-other", wait=1.0)
    assert messages == []  # still invisible
    # The push consumer's nack: ChangeInvisibleDuration with the original handle, longer
    # than a renewal interval (a renewal after it would shorten it to 1 s, again and again).
    nack = stub(proxy).ChangeInvisibleDuration(spb.ChangeInvisibleDurationRequest(
        group=pb.Resource(name=group), topic=pb.Resource(name=topic),
        receipt_handle=first.system_properties.receipt_handle,
        invisible_duration=duration_pb2.Duration(seconds=2),
        message_id=first.system_properties.message_id), timeout=10, metadata=[("x-mq-client-id", "client-a")])
    assert nack.status.code == pb.OK and nack.receipt_handle

    second = receive_one(proxy, group, topic, client_id="client-b", auto_renew=True)
    assert second.system_properties.delivery_attempt == 2
    before = renewals()
    wait_until(lambda: renewals() >= before + 1, 20, message="a renewal of the second delivery")
    bye = stub(proxy).NotifyClientTermination(spb.NotifyClientTerminationRequest(group=pb.Resource(name=group)),
                                              timeout=10, metadata=[("x-mq-client-id", "client-b")])
    assert bye.status.code == pb.OK

    third = receive_one(proxy, group, topic, client_id="client-c", invisible=30.0)
    assert third.system_properties.delivery_attempt == 3
    assert ack(proxy, group, topic, third).code == pb.OK


def test_settings_advertise_the_brokers_limits(rmq_cluster: Cluster, renewing_proxy: ServiceProcess,
                                              unique_name: Callable[[str], str]) -> None:
    """That proxy is configured with max_body_bytes=1000 and max_delivery_attempts=99; the
    broker has 4 MiB and 3: the proxy advertises and enforces the broker's."""
    topic = unique_name("limits")
    producer = Telemetry(renewing_proxy.address, f"limits-{uuid.uuid4().hex[:8]}", topic)
    try:
        reply = producer.next("settings", 10)
        assert reply.status.code == pb.OK
        assert reply.settings.publishing.max_body_size == 4 * 1024 * 1024
    finally:
        producer.close()
    consumer = Telemetry(renewing_proxy.address, f"limits-{uuid.uuid4().hex[:8]}", topic)
    try:
        consumer.outbox.put(spb.TelemetryCommand(settings=pb.Settings(
            client_type=pb.PUSH_CONSUMER, user_agent=pb.UA(language=pb.PYTHON),
            subscription=pb.Subscription(group=pb.Resource(name=unique_name("g"))))))
        consumer.next("settings", 10)  # the reply to the producer settings it opened with
        reply = consumer.next("settings", 10)
        assert reply.settings.backoff_policy.max_attempts == 3
        assert len(reply.settings.backoff_policy.customized_backoff.next) == 3
    finally:
        consumer.close()
    # A body above the proxy's configured 1000 bytes, within the broker's limit, is accepted.
    send_normal(renewing_proxy.address, topic, b"x" * 2000)
