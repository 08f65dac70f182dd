"""The proxy's pure parts: error codes, Settings replies, message conversion, queue choice."""

from __future__ import annotations

import gzip
import hashlib

import grpc
import pytest

from services.proxy import settings
from services.proxy.codes import code_for, status
from services.proxy.config import ProxyConfig
from services.proxy.convert import delivered_to_rmq, to_native
from services.proxy.protocol import Code, definition_pb2 as pb
from services.proxy.relay import pick_other, pick_queue, same_queue
from txmq.faults import FaultTable
from txmq.errors import (InvalidIdError, MessageTooLargeError, NoLeaderError, ReceiptHandleNotFoundError,
                          TopicNotFoundError, TransactionNotFoundError, TransactionStateError, UnavailableError,
                          error_from_status)
from txmq.v1 import common_pb2, nameserver_pb2

CONFIG = ProxyConfig(nameserver_addresses=("127.0.0.1:9876",), max_delivery_attempts=5,
                     consumer_backoff_initial_seconds=1, consumer_backoff_multiplier=2,
                     consumer_backoff_max_seconds=5)


@pytest.mark.parametrize("error, code", [
    (InvalidIdError("transaction id", "x", "bad"), Code.INVALID_TRANSACTION_ID),
    (TransactionNotFoundError("T1"), Code.INVALID_TRANSACTION_ID),
    (TransactionStateError("T1", "ROLLED_BACK", "COMMIT"), Code.INVALID_TRANSACTION_ID),
    (InvalidIdError("receipt handle", "x", "bad"), Code.INVALID_RECEIPT_HANDLE),
    (ReceiptHandleNotFoundError("R1"), Code.INVALID_RECEIPT_HANDLE),
    (MessageTooLargeError(10, 5), Code.MESSAGE_BODY_TOO_LARGE),
    (TopicNotFoundError("t"), Code.TOPIC_NOT_FOUND),
    (UnavailableError("down"), Code.HA_NOT_AVAILABLE),
    (NoLeaderError("t", ["broker-0"]), Code.HA_NOT_AVAILABLE),  # a shard between leaders: retried
    (RuntimeError("bug"), Code.INTERNAL_SERVER_ERROR),
])
def test_error_codes(error: BaseException, code: int) -> None:
    assert code_for(error) == code


#: What each gRPC status of a native call must reach the official clients as: transient
#: failures as codes they retry (never 50001, a bug; never 42900 unless it is overload,
#: which the Python client does not retry).
UPSTREAM = {
    grpc.StatusCode.CANCELLED: Code.HA_NOT_AVAILABLE,
    grpc.StatusCode.UNKNOWN: Code.INTERNAL_SERVER_ERROR,
    grpc.StatusCode.INVALID_ARGUMENT: Code.BAD_REQUEST,
    grpc.StatusCode.DEADLINE_EXCEEDED: Code.PROXY_TIMEOUT,
    grpc.StatusCode.NOT_FOUND: Code.NOT_FOUND,
    grpc.StatusCode.ALREADY_EXISTS: Code.BAD_REQUEST,
    grpc.StatusCode.PERMISSION_DENIED: Code.FORBIDDEN,
    grpc.StatusCode.RESOURCE_EXHAUSTED: Code.TOO_MANY_REQUESTS,
    grpc.StatusCode.FAILED_PRECONDITION: Code.PRECONDITION_FAILED,
    grpc.StatusCode.ABORTED: Code.HA_NOT_AVAILABLE,
    grpc.StatusCode.OUT_OF_RANGE: Code.BAD_REQUEST,
    grpc.StatusCode.UNIMPLEMENTED: Code.NOT_IMPLEMENTED,
    grpc.StatusCode.INTERNAL: Code.INTERNAL_SERVER_ERROR,
    grpc.StatusCode.UNAVAILABLE: Code.HA_NOT_AVAILABLE,
    grpc.StatusCode.DATA_LOSS: Code.INTERNAL_SERVER_ERROR,
    grpc.StatusCode.UNAUTHENTICATED: Code.UNAUTHORIZED,
}


TRANSPORT = {grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN, grpc.StatusCode.DEADLINE_EXCEEDED,
             grpc.StatusCode.ABORTED, grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.UNIMPLEMENTED,
             grpc.StatusCode.INTERNAL, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DATA_LOSS}


def test_every_upstream_grpc_status_has_its_rocketmq_code_and_names_its_cause() -> None:
    assert set(UPSTREAM) == set(grpc.StatusCode) - {grpc.StatusCode.OK}
    for grpc_code, code in UPSTREAM.items():
        # As the proxy sees them: mapped by ``upstream.call`` (no reason: only the status
        # decides), and raw (a call not wrapped).
        raw = grpc.aio.AioRpcError(grpc_code, grpc.aio.Metadata(), grpc.aio.Metadata(), details="went wrong")
        for error in (error_from_status(grpc_code, "went wrong"), raw):
            answered = status(error)
            assert (grpc_code, answered.code) == (grpc_code, code)
            assert answered.message.endswith("went wrong")
            # Failures only the status describes name it and their cause; txmq's own
            # refusals (and the services') carry messages that say what was wrong.
            if grpc_code in TRANSPORT:
                assert answered.message.startswith(grpc_code.name + ": "), answered.message
            else:
                assert answered.message == "went wrong"
    assert "cancelled upstream" in status(error_from_status(grpc.StatusCode.CANCELLED, "x")).message


def test_producer_settings_reply() -> None:
    client = pb.Settings(client_type=pb.PRODUCER, publishing=pb.Publishing(
        topics=[pb.Resource(name="t")], max_body_size=128 << 20), metric=pb.Metric(on=True))
    reply = settings.reply(client, CONFIG)
    assert reply.publishing.max_body_size == CONFIG.max_body_bytes
    assert reply.backoff_policy.HasField("exponential_backoff") and reply.backoff_policy.max_attempts == 3
    assert not reply.metric.on and [t.name for t in reply.publishing.topics] == ["t"]


@pytest.mark.parametrize("language, strategy", [(pb.PYTHON, "customized_backoff"), (pb.JAVA, "customized_backoff"),
                                                (pb.NODE_JS, "exponential_backoff")])
def test_consumer_settings_reply(language: int, strategy: str) -> None:
    client = pb.Settings(client_type=pb.PUSH_CONSUMER, user_agent=pb.UA(language=language),
                         subscription=pb.Subscription(group=pb.Resource(name="g")))
    reply = settings.reply(client, CONFIG)
    policy = reply.backoff_policy
    assert policy.WhichOneof("strategy") == strategy and policy.max_attempts == 5
    if strategy == "customized_backoff":
        assert [d.seconds for d in policy.customized_backoff.next] == [1, 2, 4, 5, 5]
    assert reply.subscription.receive_batch_size > 0 and not reply.subscription.fifo
    assert reply.subscription.long_polling_timeout.seconds == 20


def test_advertised_endpoints() -> None:
    requested = pb.Endpoints(scheme=pb.DOMAIN_NAME, addresses=[pb.Address(host="mq.example", port=8081)])
    assert settings.advertised(CONFIG, requested, 1234) == requested
    bare = pb.Endpoints(addresses=[pb.Address(host="10.0.0.1", port=8081)])
    assert settings.advertised(CONFIG, bare, 1234).scheme == pb.IPv4
    fixed = ProxyConfig(nameserver_addresses=("n:1",), advertise_address="proxy.txmq:8081")
    out = settings.advertised(fixed, requested, 1234)
    assert out.scheme == pb.DOMAIN_NAME and out.addresses[0].host == "proxy.txmq"


def rmq_message(**system: object) -> pb.Message:
    m = pb.Message(topic=pb.Resource(name="orders"), body=b"hello", user_properties={"a": "1"})
    m.system_properties.message_id = "0102ABC"
    m.system_properties.message_type = pb.TRANSACTION
    m.system_properties.body_encoding = pb.IDENTITY
    for key, value in system.items():
        setattr(m.system_properties, key, value)
    return m


def test_half_message_to_native() -> None:
    m = rmq_message(tag="T", born_host="h")
    m.system_properties.keys.append("k")
    m.system_properties.orphaned_transaction_recovery_duration.seconds = 7
    native = to_native(m, client_id="c1", max_body_bytes=10)
    assert native.type == common_pb2.MESSAGE_TYPE_TRANSACTION
    assert native.producer_group == "orders" and native.producer_client_id == "c1"
    assert native.message_id == "0102ABC" and native.check_immunity_seconds == 7
    assert list(native.keys) == ["k"] and dict(native.properties) == {"a": "1"} and native.tag == "T"


def test_gzip_body_is_inflated_and_limits_apply() -> None:
    m = rmq_message(body_encoding=pb.GZIP)
    m.body = gzip.compress(b"hello")
    assert to_native(m, client_id="c", max_body_bytes=10).body == b"hello"
    with pytest.raises(Exception) as info:
        to_native(rmq_message(), client_id="c", max_body_bytes=3)
    assert code_for(info.value) == Code.MESSAGE_BODY_TOO_LARGE


def test_delivered_message_carries_what_clients_need() -> None:
    d = common_pb2.DeliveredMessage(topic="orders", message=common_pb2.Message(topic="orders", body=b"x",
                                                                               message_id="M1"),
                                    broker_name="b", delivery_attempt=2, receipt_handle="R1")
    out = delivered_to_rmq(d, 0)
    sp = out.system_properties
    assert sp.body_encoding == pb.IDENTITY and sp.body_digest.type == pb.MD5
    assert sp.body_digest.checksum == hashlib.md5(b"x").hexdigest().upper()
    assert sp.receipt_handle == "R1" and sp.delivery_attempt == 2 and sp.message_id == "M1"


def test_queue_choice_is_stable_per_message_id() -> None:
    queues = [nameserver_pb2.QueueRoute(broker_name=f"b{i % 2}", queue_id=i) for i in range(8)]
    chosen = {pick_queue(queues, f"id-{n}").queue_id for n in range(200)}
    assert len(chosen) == 8
    assert all(pick_queue(queues, "same") == pick_queue(queues, "same") for _ in range(10))


def test_a_failed_send_moves_only_to_a_shard_the_fault_table_lets_take_traffic() -> None:
    """Both shards failing (two leaders lost at once): no other shard to move to (None), the
    send stays on its own and follows its next leader's address in the new route."""
    queues = [nameserver_pb2.QueueRoute(broker_name=f"b{i % 2}", queue_id=i, broker_address=f"old-{i % 2}")
              for i in range(4)]
    faults = FaultTable()
    faults.failed("b0")
    assert pick_other(queues, "id", faults, {"b0"}).broker_name == "b1"
    faults.failed("b1")
    assert pick_other(queues, "id", faults, {"b0"}) is None
    assert pick_queue(queues, "id", faults, {"b0"}).broker_name in {"b0", "b1"}  # a first pick still goes
    moved = [nameserver_pb2.QueueRoute(broker_name=q.broker_name, queue_id=q.queue_id,
                                       broker_address=f"new-{q.queue_id % 2}") for q in queues]
    again = same_queue(moved, queues[1])
    assert again is not None and (again.broker_name, again.queue_id, again.broker_address) == ("b1", 1, "new-1")
    assert same_queue(moved[::2], queues[1]) is None  # b1 not routed (between leaders)


@pytest.mark.parametrize("kind", [pb.LITE, 77])
def test_a_message_type_txmq_does_not_take_is_refused_by_name_or_number(kind: int) -> None:
    """77 names no MessageType (a corrupt or newer client): refused NOT_IMPLEMENTED with the
    number, not an unexpected error (the every-RPC fuzz once drew one: rmq 50001)."""
    with pytest.raises(Exception) as info:
        to_native(rmq_message(message_type=kind), client_id="c", max_body_bytes=10)
    assert code_for(info.value) == Code.NOT_IMPLEMENTED
    assert ("LITE" if kind == pb.LITE else "77") in str(info.value)
