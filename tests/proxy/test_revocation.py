"""A right revoked by a credentials reload stops the orphan checks the proxy carries to an
official client on its open Telemetry stream (RecoverOrphanedTransactionCommand: the half
message, body and properties), on a real cluster with auth on (name server, broker, checker,
proxy; the credential files rewritten while they run). Each test failed before the checker
and the proxy decided open streams again (docs/security.md, "Revoking")."""

from __future__ import annotations

import json
import queue
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

import grpc
import pytest
from google.protobuf import duration_pb2

from services.proxy.checks import CHECK_CREDIT_PER_CLIENT
from services.proxy.protocol import Code, definition_pb2 as pb, service_pb2 as spb, service_pb2_grpc
from tests.support.cluster import Cluster
from tests.support.metrics import metric_sum
from tests.support.ownership import access_key_of, bearer, secret_of, secured_cluster, signed, write_credentials
from tests.support.waiting import wait_until
from txmq.v1 import broker_pb2, broker_pb2_grpc

pytestmark = pytest.mark.timeout(180)

RPC_TIMEOUT = 10.0
RELOAD = {"TXMQ_AUTH_RELOAD_SECONDS": "0.2"}
#: rmc and rmk produce transactionally to their own topics (a RocketMQ producer's group is
#: its topic); rms sends the halves of both; rmr consumes rvr in group rvg (rms may too).
RMQ = ("rmc", "rmk", "rms", "rmr")
ACL = [
    {"principal": "rmc", "resource": "topic:rvt", "actions": ["publish"]},
    {"principal": "rmc", "resource": "producer_group:rvt", "actions": ["check"]},
    {"principal": "rmk", "resource": "topic:rvk", "actions": ["publish"]},
    {"principal": "rmk", "resource": "producer_group:rvk", "actions": ["check"]},
    {"principal": "rms", "resource": "topic:rv*", "actions": ["publish"]},
    {"principal": "rms", "resource": "producer_group:rv*", "actions": ["check"]},
    {"principal": "rmr", "resource": "topic:rvr", "actions": ["subscribe"]},
    {"principal": "rmr", "resource": "consumer_group:rvg", "actions": ["subscribe"]},
    {"principal": "rms", "resource": "topic:rvr", "actions": ["subscribe"]},
    {"principal": "rms", "resource": "consumer_group:rvg", "actions": ["subscribe"]},
]


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, Path]]:
    workdir = tmp_path_factory.mktemp("proxy-revocation")
    # Checks due 1 s after a half; one a client neither answers nor receives comes back by
    # itself only after 30 s.
    cluster = secured_cluster(workdir, extra_acl=ACL, extra_rmq=RMQ,
                              broker_env={"TXMQ_TRANSACTION_TIMEOUT_SECONDS": "1.0",
                                          "TXMQ_CHECK_INTERVAL_SECONDS": "60", **RELOAD},
                              checker_env={"TXMQ_BROKER_REFRESH_SECONDS": "0.5", "TXMQ_ANSWER_TIMEOUT_SECONDS": "30",
                                           "TXMQ_LEASE_SECONDS": "60", **RELOAD},
                              proxy_env=RELOAD)
    try:
        for topic in ("rvt", "rvk", "rvr"):
            cluster.create_topic(topic, queue_count=1)
            cluster.wait_route(topic, 1)
        yield cluster, workdir
    finally:
        cluster.stop()


def stub(cluster: Cluster) -> service_pb2_grpc.MessagingServiceStub:
    return service_pb2_grpc.MessagingServiceStub(grpc.insecure_channel(cluster.proxy_addresses[0]))


def send_half(cluster: Cluster, topic: str, body: bytes) -> str:
    """A transactional message sent by rms, left undecided: its transaction id."""
    message = pb.Message(topic=pb.Resource(name=topic), body=body)
    message.system_properties.message_id = uuid.uuid4().hex.upper()
    message.system_properties.message_type = pb.TRANSACTION
    message.system_properties.body_encoding = pb.IDENTITY
    message.system_properties.born_host = "test"
    response = stub(cluster).SendMessage(spb.SendMessageRequest(messages=[message]), timeout=RPC_TIMEOUT,
                                         metadata=signed("rms", "rms-sender"))
    assert response.status.code == pb.OK, response.status
    return response.entries[0].transaction_id


class Telemetry:
    """An official producer's Telemetry stream on the wire, signed with its access key."""

    def __init__(self, cluster: Cluster, who: str, topic: str) -> None:
        self.outbox: queue.Queue[spb.TelemetryCommand | None] = queue.Queue()
        self.checks: queue.Queue[str] = queue.Queue()
        self.ended: grpc.RpcError | None = None
        self.done = threading.Event()
        self.settings = threading.Event()
        self.outbox.put(spb.TelemetryCommand(settings=pb.Settings(client_type=pb.PRODUCER, publishing=pb.Publishing(
            topics=[pb.Resource(name=topic)], max_body_size=1 << 22, validate_message_type=True))))
        self.call = stub(cluster).Telemetry(self._requests(), timeout=150,
                                            metadata=signed(who, f"{who}-{uuid.uuid4().hex[:8]}"))
        threading.Thread(target=self._read, daemon=True).start()
        assert self.settings.wait(RPC_TIMEOUT), "no Settings reply"

    def _requests(self) -> Iterator[spb.TelemetryCommand]:
        while (item := self.outbox.get()) is not None:
            yield item

    def _read(self) -> None:
        try:
            for command in self.call:
                if command.HasField("settings"):
                    self.settings.set()
                elif command.HasField("recover_orphaned_transaction_command"):
                    self.checks.put(command.recover_orphaned_transaction_command.transaction_id)
        except grpc.RpcError as exc:
            self.ended = exc
        finally:
            self.done.set()

    def check(self, timeout: float) -> str | None:
        try:
            return self.checks.get(timeout=timeout)
        except queue.Empty:
            return None

    def close(self) -> None:
        self.outbox.put(None)
        self.call.cancel()


def subscribed_credit(cluster: Cluster, group: str) -> float:
    """The credit the checker holds for the group's subscriptions (the proxy's, for its clients)."""
    return sum(metric_sum(c.metrics_port, "txmq_check_credit_free", {"group": group}) for c in cluster.checkers)


def rewrite(workdir: Path, acl: list[dict[str, Any]], keys_of: tuple[str, ...] = RMQ) -> None:
    """The credential files as ``secured_cluster`` writes them, with ``acl``, and access keys for
    ``keys_of`` only (each file swapped whole, as a Secret update swaps it)."""
    staging = workdir / "staging"
    staging.mkdir(exist_ok=True)
    creds, keys = write_credentials(staging, acl, RMQ)
    keys.write_text(json.dumps({"access_keys": {access_key_of(n): {"principal": n, "secret": secret_of(n)}
                                                for n in keys_of}}))
    creds.replace(workdir / creds.name)
    keys.replace(workdir / keys.name)


@pytest.fixture
def files(secured: tuple[Cluster, Path]) -> Iterator[Path]:
    """The cluster's credential files, written back as they were after the test (read by each
    service on its next look, TXMQ_AUTH_RELOAD_SECONDS after its last)."""
    yield secured[1]
    rewrite(secured[1], ACL)
    time.sleep(3 * float(RELOAD["TXMQ_AUTH_RELOAD_SECONDS"]))


def test_a_revoked_check_right_stops_the_checks_on_an_open_telemetry_stream(
        secured: tuple[Cluster, Path], files: Path) -> None:
    """rmc's Telemetry stream is sent the check of its group's half. Its check right is
    revoked: the subscription the proxy keeps for it at the checker ends, and the check of a
    half sent afterwards never reaches the stream. Before the fix the subscription, authorized
    when it was opened, stayed and the stream was sent that half's body."""
    cluster, _ = secured
    telemetry = Telemetry(cluster, "rmc", "rvt")
    try:
        wait_until(lambda: subscribed_credit(cluster, "rvt") == CHECK_CREDIT_PER_CLIENT, 15.0,
                   message="the proxy's subscription for rmc")
        first = send_half(cluster, "rvt", b"checked while allowed")
        assert telemetry.check(15.0) == first

        rewrite(files, [r for r in ACL if r != {"principal": "rmc", "resource": "producer_group:rvt",
                                                 "actions": ["check"]}])
        wait_until(lambda: subscribed_credit(cluster, "rvt") == 0, 15.0,
                   message="the subscription for rmc to end at the checker")
        later = send_half(cluster, "rvt", b"not for rmc")
        assert telemetry.check(5.0) is None, f"a check reached rmc after the revoke ({later})"
        assert not telemetry.done.is_set(), telemetry.ended  # its stream itself may stay (it may publish)
    finally:
        telemetry.close()


def test_a_removed_access_key_ends_an_open_telemetry_stream(secured: tuple[Cluster, Path], files: Path) -> None:
    """rmk's access key is removed (rmk and its rights stay): its open Telemetry stream ends
    UNAUTHENTICATED, and the proxy's subscription for it at the checker with it. Before the
    fix the stream, signed once, stayed open and kept being sent rmk's checks."""
    cluster, _ = secured
    telemetry = Telemetry(cluster, "rmk", "rvk")
    try:
        wait_until(lambda: subscribed_credit(cluster, "rvk") == CHECK_CREDIT_PER_CLIENT, 15.0,
                   message="the proxy's subscription for rmk")
        rewrite(files, ACL, keys_of=("rmc", "rms"))
        assert telemetry.done.wait(10.0), "rmk's stream is still open"
        assert telemetry.ended is not None and telemetry.ended.code() == grpc.StatusCode.UNAUTHENTICATED, \
            telemetry.ended
        wait_until(lambda: subscribed_credit(cluster, "rvk") == 0, 15.0,
                   message="the subscription for rmk to end at the checker")
    finally:
        telemetry.close()


def receive(cluster: Cluster, who: str, wait_seconds: int, invisible_seconds: float) -> list[spb.ReceiveMessageResponse]:
    """A simple consumer's ReceiveMessage of rvr in group rvg: every frame the proxy wrote."""
    request = spb.ReceiveMessageRequest(
        group=pb.Resource(name="rvg"), message_queue=pb.MessageQueue(topic=pb.Resource(name="rvr"), id=-1),
        filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"), batch_size=4,
        long_polling_timeout=duration_pb2.Duration(seconds=wait_seconds))
    request.invisible_duration.FromMilliseconds(int(invisible_seconds * 1000))
    return list(stub(cluster).ReceiveMessage(request, timeout=wait_seconds + RPC_TIMEOUT,
                                             metadata=signed(who, f"{who}-simple")))


def test_a_long_poll_whose_access_key_is_removed_is_written_nothing(secured: tuple[Cluster, Path],
                                                                     files: Path) -> None:
    """rmr long-polls rvr through the proxy; its access key is removed meanwhile (rmr and its
    rights stay, so the broker, which knows no access keys, delivers to the proxy). A message
    sent then is not written to rmr (the receive is refused in band, UNAUTHORIZED), and an
    allowed consumer of the group gets it once its invisibility ends (the refused delivery
    counted as one attempt). Fails without the proxy's re-check before writing."""
    cluster, _ = secured
    broker = broker_pb2_grpc.BrokerServiceStub(grpc.insecure_channel(cluster.brokers[0].address))

    def waiting() -> bool:
        clients = broker.DescribeGroupClients(broker_pb2.DescribeGroupClientsRequest(group="rvg"),
                                              timeout=RPC_TIMEOUT, metadata=bearer("nameserver")).clients
        return any(c.waiting for c in clients)

    frames: list[Any] = []
    poller = threading.Thread(target=lambda: frames.extend(receive(cluster, "rmr", 20, 1.0)), daemon=True)
    poller.start()
    wait_until(waiting, 15.0, message="rmr's long poll waiting at the broker")
    rewrite(files, ACL, keys_of=tuple(n for n in RMQ if n != "rmr"))

    def refused() -> bool:
        route = stub(cluster).QueryRoute(spb.QueryRouteRequest(topic=pb.Resource(name="rvr")), timeout=RPC_TIMEOUT,
                                         metadata=signed("rmr", "rmr-probe"))
        return route.status.code == Code.UNAUTHORIZED
    wait_until(refused, 15.0, message="the proxy to read the removal")
    assert waiting(), "the long poll ended before the message came"
    message = pb.Message(topic=pb.Resource(name="rvr"), body=b"not for rmr")
    message.system_properties.message_id = uuid.uuid4().hex.upper()
    message.system_properties.message_type = pb.NORMAL
    message.system_properties.body_encoding = pb.IDENTITY
    message.system_properties.born_host = "test"
    sent = stub(cluster).SendMessage(spb.SendMessageRequest(messages=[message]), timeout=RPC_TIMEOUT,
                                     metadata=signed("rms", "rms-sender"))
    assert sent.status.code == pb.OK, sent.status
    poller.join(30)
    assert not poller.is_alive()
    assert [f.message.body for f in frames if f.HasField("message")] == [], "written to rmr after the removal"
    assert [f.status.code for f in frames if f.HasField("status")] == [Code.UNAUTHORIZED], frames

    def redelivered() -> list[pb.Message]:
        return [f.message for f in receive(cluster, "rms", 2, 30.0) if f.HasField("message")]
    got = wait_until(redelivered, 15.0, message="the message for an allowed consumer")
    assert [(m.body, m.system_properties.delivery_attempt) for m in got] == [(b"not for rmr", 2)]
