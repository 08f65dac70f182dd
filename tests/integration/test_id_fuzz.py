"""No INTERNAL on undecodable ids (issue 30): every RPC that takes an id — natively and
through the RocketMQ proxy — is sent ids a forger would make: the right kind letter, this
broker's name (so they route here), any version, any payload bytes (topics of invalid
UTF-8 among them), with or without a tag, behind a valid CRC; plus arbitrary strings. The
property, per call: never INTERNAL, UNKNOWN or CANCELLED, no entry answered so, and no
RocketMQ 50000/50001 in band."""

from __future__ import annotations

import base64
import struct
import zlib
from typing import Any, Callable, Iterator

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.proxy.protocol import definition_pb2 as pb, service_pb2 as spb, service_pb2_grpc
from tests.conftest import TEST_BROKER_ENV
from tests.support.cluster import Cluster
from txmq.v1 import admin_pb2, admin_pb2_grpc, broker_pb2, broker_pb2_grpc, checker_pb2, checker_pb2_grpc, common_pb2

pytestmark = pytest.mark.timeout(600)

EXAMPLES = 150
FAILED = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.CANCELLED}
FAILED_ENTRY = {s.value[0] for s in FAILED}
C = common_pb2


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path_factory.mktemp("id-fuzz"), broker_env=TEST_BROKER_ENV, checker=True, proxies=1,
                      nameserver_env={"TXMQ_AUTO_CREATE_TOPICS": "true"})
    try:
        cluster.create_topic("fz", queue_count=1)
        yield cluster
    finally:
        cluster.stop()


def forged_ids(broker: str) -> st.SearchStrategy[str]:
    name = broker.encode()
    checksummed = st.builds(
        lambda kind, version, named, rest: kind + base64.urlsafe_b64encode(
            _with_crc(bytes([version]) + named + rest)).rstrip(b"=").decode(),
        st.sampled_from("TRM"), st.sampled_from([1, 2, 0, 3, 255]),
        st.sampled_from([bytes([len(name)]) + name, bytes([len(name) + 3]) + name, b"\x00", b"\xff" + name]),
        st.binary(max_size=80) | st.builds(lambda topic, tail: struct.pack(">IIQIB", 1, 0, 0, 1, len(topic)) + topic
                                           + tail, st.binary(max_size=20), st.binary(max_size=24)))
    return checksummed | st.text(max_size=40) | st.sampled_from(["", "T", "R", "M", "T" + "A" * 3000])


def _with_crc(raw: bytes) -> bytes:
    return raw + struct.pack(">I", zlib.crc32(raw))


def check(call: Callable[[], Any], entries: Callable[[Any], list[int]] | None = None,
          in_band: Callable[[Any], list[int]] | None = None) -> None:
    try:
        response = call()
    except grpc.RpcError as exc:
        assert exc.code() not in FAILED, f"{exc.code().name}: {exc.details()}"
        return
    if entries is not None:
        assert not set(entries(response)) & FAILED_ENTRY, response
    if in_band is not None:
        assert not set(in_band(response)) & {50000, 50001}, response


def fuzz(broker: str, send: Callable[[str], None]) -> None:
    @settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(forged_ids(broker))
    def run(text: str) -> None:
        send(text)
    run()


def test_native_rpcs_taking_ids(fuzzed: Cluster) -> None:
    broker_name = fuzzed.brokers[0].name
    b = broker_pb2_grpc.BrokerServiceStub(fuzzed.channel(fuzzed.brokers[0].address))
    a = admin_pb2_grpc.AdminServiceStub(fuzzed.channel())
    t = 5.0

    def entry_codes(r):
        return [e.code for e in r.entries]

    targets: list[Callable[[str], None]] = [
        lambda x: check(lambda: b.EndTransaction(broker_pb2.EndTransactionRequest(
            transaction_id=x, message_id=x, resolution=C.TRANSACTION_RESOLUTION_COMMIT,
            source=C.TRANSACTION_SOURCE_CLIENT, producer_group="fz"), timeout=t)),
        lambda x: check(lambda: list(b.Produce(iter([broker_pb2.ProduceRequest(entries=[broker_pb2.ProduceEntry(
            request_id=1, end_transaction=broker_pb2.EndTransactionRequest(
                transaction_id=x, resolution=C.TRANSACTION_RESOLUTION_ROLLBACK,
                source=C.TRANSACTION_SOURCE_CLIENT))])]), timeout=t)),
            entries=lambda rs: [r.status.code for m in rs for r in m.results]),
        lambda x: check(lambda: b.GetTransaction(broker_pb2.GetTransactionRequest(transaction_id=x), timeout=t)),
        lambda x: check(lambda: b.QueryTransactions(broker_pb2.QueryTransactionsRequest(page_token=x), timeout=t)),
        lambda x: check(lambda: b.AckMessages(broker_pb2.AckMessagesRequest(
            consumer_group="fz", topic="fz", receipt_handles=[x]), timeout=t), entries=entry_codes),
        lambda x: check(lambda: b.ReceiveMessages(broker_pb2.ReceiveMessagesRequest(
            consumer_group="fz", topic="fz", queue_id=-1, max_messages=1, invisible_duration_seconds=1,
            ack_receipt_handles=[x]), timeout=t), entries=lambda r: [e.code for e in r.ack_entries]),
        lambda x: check(lambda: b.ChangeInvisibleDuration(broker_pb2.ChangeInvisibleDurationRequest(
            consumer_group="fz", topic="fz", receipt_handle=x, invisible_duration_seconds=1), timeout=t)),
        lambda x: check(lambda: b.DeadLetterMessage(broker_pb2.DeadLetterMessageRequest(
            consumer_group="fz", topic="fz", receipt_handle=x), timeout=t)),
        lambda x: check(lambda: b.SendMessage(broker_pb2.SendMessageRequest(message=C.Message(
            topic="fz", body=b"f", type=C.MESSAGE_TYPE_TRANSACTION, producer_group="fz", message_id=x),
            global_transaction_id=x), timeout=t)),
        lambda x: check(lambda: b.ReportChecks(broker_pb2.ReportChecksRequest(reports=[broker_pb2.CheckReport(
            transaction_id=x, claim_token=x, outcome=broker_pb2.CHECK_OUTCOME_ANSWERED,
            result=C.CHECK_RESULT_COMMIT, producer_group="fz")]), timeout=t),
            entries=lambda r: [e.code for e in r.entries]),
        lambda x: check(lambda: b.ApplyGlobalTransaction(broker_pb2.ApplyGlobalTransactionRequest(
            global_transaction_id=x, state=C.TRANSACTION_STATE_ROLLED_BACK,
            source=C.TRANSACTION_SOURCE_CLIENT), timeout=t)),
        lambda x: check(lambda: b.ResolveGlobalTransaction(broker_pb2.ResolveGlobalTransactionRequest(
            global_transaction_id=x, participant=broker_name), timeout=t)),
        lambda x: check(lambda: b.GetGlobalTransaction(broker_pb2.GetGlobalTransactionRequest(
            global_transaction_id=x), timeout=t)),
        lambda x: check(lambda: b.ReturnDeadLetters(broker_pb2.ReturnDeadLettersRequest(
            consumer_group="fz", message_ids=[x]), timeout=t)),
        lambda x: check(lambda: a.DescribeTransaction(admin_pb2.DescribeTransactionRequest(transaction_id=x),
                                                      timeout=t)),
        lambda x: check(lambda: a.ResolveTransaction(admin_pb2.ResolveTransactionRequest(
            transaction_id=x, resolution=C.TRANSACTION_RESOLUTION_ROLLBACK, operator="fuzz"), timeout=t)),
    ]
    for target in targets:
        fuzz(broker_name, target)


def test_a_check_streams_answers_naming_ids(fuzzed: Cluster) -> None:
    broker_name = fuzzed.brokers[0].name
    stub = checker_pb2_grpc.CheckerServiceStub(fuzzed.channel(fuzzed.checkers[0].address))
    R = checker_pb2.CheckTransactionStateRequest

    def answer(x: str) -> None:
        requests = [R(subscribe=checker_pb2.Subscribe(producer_groups=["fz"], client_id="fuzz", check_credit=1)),
                    R(answer=checker_pb2.CheckAnswer(check_id=x, transaction_id=x, broker_name=broker_name,
                                                     producer_group="fz", result=C.CHECK_RESULT_COMMIT)),
                    R(received=checker_pb2.CheckReceived(check_id=x))]
        try:
            for response in stub.CheckTransactionState(iter(requests), timeout=3):
                if response.WhichOneof("command") == "error":
                    assert response.error.code not in FAILED_ENTRY, response
        except grpc.RpcError as exc:
            assert exc.code() not in FAILED, f"{exc.code().name}: {exc.details()}"
    fuzz(broker_name, answer)


def test_rocketmq_rpcs_taking_ids(fuzzed: Cluster) -> None:
    broker_name = fuzzed.brokers[0].name
    proxy = service_pb2_grpc.MessagingServiceStub(fuzzed.channel(fuzzed.proxy_addresses[0]))
    t, md = 5.0, [("x-mq-client-id", "fuzz")]

    def status(r):
        return [r.status.code]

    topic, group = pb.Resource(name="fz"), pb.Resource(name="fz")

    def send(x: str) -> None:
        m = pb.Message(topic=topic, body=b"f")
        m.system_properties.message_id = x
        m.system_properties.message_type = pb.TRANSACTION
        check(lambda: proxy.SendMessage(spb.SendMessageRequest(messages=[m]), timeout=t, metadata=md),
              in_band=lambda r: [r.status.code, *(e.status.code for e in r.entries)])

    targets: list[Callable[[str], None]] = [
        lambda x: check(lambda: proxy.EndTransaction(spb.EndTransactionRequest(
            topic=topic, transaction_id=x, message_id=x, resolution=pb.COMMIT, source=pb.SOURCE_SERVER_CHECK),
            timeout=t, metadata=md), in_band=status),
        lambda x: check(lambda: proxy.AckMessage(spb.AckMessageRequest(group=group, topic=topic, entries=[
            spb.AckMessageEntry(message_id=x, receipt_handle=x)]), timeout=t, metadata=md),
            in_band=lambda r: [r.status.code, *(e.status.code for e in r.entries)]),
        lambda x: check(lambda: proxy.ChangeInvisibleDuration(spb.ChangeInvisibleDurationRequest(
            group=group, topic=topic, receipt_handle=x, message_id=x), timeout=t, metadata=md), in_band=status),
        lambda x: check(lambda: proxy.ForwardMessageToDeadLetterQueue(spb.ForwardMessageToDeadLetterQueueRequest(
            group=group, topic=topic, receipt_handle=x, message_id=x, delivery_attempt=1, max_delivery_attempts=3),
            timeout=t, metadata=md), in_band=status),
        send,
    ]
    for target in targets:
        fuzz(broker_name, target)
