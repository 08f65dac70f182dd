"""A push consumer's renewals are its own: a refused Ack, nack or dead-lettering of another
principal's auto-renewed delivery through the RocketMQ proxy changes nothing.

The proxy keeps a push consumer's delivery invisible (``renew``) until the client acks or
nacks it. Those calls arrive with the handle the client got; the proxy stops renewing and
sends the newest handle to the broker, which then decides what the handle names (its topic,
the group it was issued to). A principal allowed on the group but not on the delivery's topic
is refused by the broker, so it must not have stopped the owner's renewals on the way: the
delivery would become visible and be redelivered to the group (a duplicate the owner never
nacked)."""

from __future__ import annotations

import time
from typing import Iterator

import pytest
from google.protobuf import duration_pb2

from services.proxy.protocol import Code, definition_pb2 as pb, service_pb2 as spb, service_pb2_grpc
from tests.support.cluster import Cluster
from tests.support.ownership import RMQ_OK, Native, Census, secured_cluster, signed

pytestmark = pytest.mark.timeout(180)

RPC_TIMEOUT = 10.0
#: The owner's deliveries: invisible this long, renewed every half of it by the proxy.
INVISIBLE_SECONDS = 1.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with secured_cluster(tmp_path_factory.mktemp("renewal-ownership")) as cluster:
        for topic in ("ta", "tb"):
            cluster.create_topic(topic, queue_count=1)
        yield cluster


def _receive(stub: service_pb2_grpc.MessagingServiceStub, who: str, topic: str, auto_renew: bool,
             wait_seconds: int) -> list[pb.Message]:
    request = spb.ReceiveMessageRequest(
        group=pb.Resource(name="rcs"), message_queue=pb.MessageQueue(topic=pb.Resource(name=topic), id=-1),
        filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"), batch_size=1, auto_renew=auto_renew,
        long_polling_timeout=duration_pb2.Duration(seconds=wait_seconds))
    request.invisible_duration.FromMilliseconds(int(INVISIBLE_SECONDS * 1000))
    frames = list(stub.ReceiveMessage(request, timeout=RPC_TIMEOUT, metadata=signed(who, f"{who}-push")))
    return [f.message for f in frames if f.HasField("message")]


def test_a_refused_call_on_another_principals_renewed_delivery_leaves_it_renewed(cluster: Cluster) -> None:
    native = Native(cluster, Census())
    stub = service_pb2_grpc.MessagingServiceStub(native.raw(cluster.proxy_addresses[0]))
    try:
        native.normal("owner", "tb")
        got: list[pb.Message] = []
        deadline = time.monotonic() + 30
        while not got and time.monotonic() < deadline:
            got = _receive(stub, "rowner", "tb", auto_renew=True, wait_seconds=1)
        assert got, "rowner received nothing from tb"
        handle = got[0].system_properties.receipt_handle
        message_id = got[0].system_properties.message_id

        # rreader holds subscribe on the group rcs, not on tb: each call is refused...
        group, wrong_topic = pb.Resource(name="rcs"), pb.Resource(name="ta")
        refusals = {
            "AckMessage": stub.AckMessage(spb.AckMessageRequest(group=group, topic=wrong_topic, entries=[
                spb.AckMessageEntry(message_id=message_id, receipt_handle=handle)]),
                timeout=RPC_TIMEOUT, metadata=signed("rreader")).status,
            "ChangeInvisibleDuration": stub.ChangeInvisibleDuration(spb.ChangeInvisibleDurationRequest(
                group=group, topic=wrong_topic, receipt_handle=handle, message_id=message_id,
                invisible_duration=duration_pb2.Duration(seconds=0)), timeout=RPC_TIMEOUT,
                metadata=signed("rreader")).status,
            "ForwardMessageToDeadLetterQueue": stub.ForwardMessageToDeadLetterQueue(
                spb.ForwardMessageToDeadLetterQueueRequest(group=group, topic=wrong_topic, receipt_handle=handle,
                                                           message_id=message_id, delivery_attempt=1,
                                                           max_delivery_attempts=16),
                timeout=RPC_TIMEOUT, metadata=signed("rreader")).status,
        }
        assert {name: s.code for name, s in refusals.items()} == {name: Code.FORBIDDEN for name in refusals}, refusals

        # ... and changed nothing: the proxy still renews rowner's delivery, so it is not
        # redelivered to the group well after its invisibility would have ended.
        time.sleep(3 * INVISIBLE_SECONDS)
        again = _receive(stub, "rowner", "tb", auto_renew=False, wait_seconds=2)
        assert again == [], "the delivery was redelivered: a refused call stopped its renewals"
        # The owner acks it with the handle it got.
        acked = stub.AckMessage(spb.AckMessageRequest(group=group, topic=pb.Resource(name="tb"), entries=[
            spb.AckMessageEntry(message_id=message_id, receipt_handle=handle)]),
            timeout=RPC_TIMEOUT, metadata=signed("rowner", "rowner-push"))
        assert acked.status.code == RMQ_OK, acked.status
    finally:
        native.close()
