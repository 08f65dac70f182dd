"""TLS end to end, with real processes and certificates made here (tests/support/certs.py):

- a cluster with mutual TLS everywhere runs transactions: the SDK over TLS, a check that the
  checker (mTLS to the broker and the name server) sends to the producer decides one;
- plaintext, no client certificate, a certificate from another CA, an expired certificate
  and a client that does not trust the servers' CA are all refused;
- a server certificate rotated on disk is served to new handshakes without a restart while
  traffic flows, and no call fails;
- a replicated shard (three replicas, etcd with TLS and client certificates) replicates over
  mutual TLS; its replication port refuses plaintext, no client certificate and another
  CA's, and serves a rotated certificate without a restart.
"""

from __future__ import annotations

import ssl
import threading
import time
from pathlib import Path
from typing import Iterator

import grpc
import pytest

import txmq
from tests.conftest import TEST_BROKER_ENV
from tests.support import presets
from tests.integration.test_checks import COMMITTED, describe, wait_state
from tests.support.certs import CertificateAuthority, install, served_serial
from tests.support.certs import channel_credentials as credentials
from tests.support.cluster import Cluster
from tests.support.replstream import exchange, open_session, replication_address
from services.broker.store import replog
from services.broker.transport import Refused
from tests.support.waiting import wait_until
from grpc_health.v1 import health_pb2, health_pb2_grpc

from txmq.v1 import common_pb2, nameserver_pb2, nameserver_pb2_grpc

LocalState = txmq.LocalTransactionState
CHECKER_ENV = presets.CHECKER


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> CertificateAuthority:
    return CertificateAuthority(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory, pki: CertificateAuthority) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("tls"), broker_env={**TEST_BROKER_ENV, "TXMQ_HEALTH_PORT": "0"},
                checker=True, checker_env=CHECKER_ENV, tls=pki, proxies=1)
    try:
        yield c
    finally:
        c.stop()


class Listener(txmq.TransactionListener):
    def __init__(self) -> None:
        self.checked: list[str] = []

    def execute_local_transaction(self, message, arg):
        return LocalState.COMMIT if message.body == b"direct" else LocalState.UNKNOWN

    def check_local_transaction(self, message):
        self.checked.append(message.transaction_id)
        return LocalState.COMMIT


def list_brokers(address: str, credentials: grpc.ChannelCredentials | None) -> list[str]:
    """ListBrokers on a channel of its own (a new connection, so a new handshake)."""
    channel = grpc.insecure_channel(address) if credentials is None else grpc.secure_channel(address, credentials)
    with channel:
        stub = nameserver_pb2_grpc.NameServerServiceStub(channel)
        return [b.name for b in stub.ListBrokers(nameserver_pb2.ListBrokersRequest(), timeout=5).brokers]


def test_a_transaction_runs_end_to_end_over_mutual_tls(secure, unique_name):
    group, topic = unique_name("g"), unique_name("orders")
    secure.create_topic(topic, 2)
    listener = Listener()
    tls = secure.client_tls()
    with txmq.TransactionProducer(secure.nameserver_address, producer_group=group, listener=listener,
                                  checker_refresh_seconds=0.5, tls=tls) as producer:
        wait_until(lambda: len(producer.connected_checkers()) == 1, 15,
                   message="the producer did not subscribe with the checker over TLS")
        direct = producer.send_in_transaction(txmq.Message(topic, b"direct"))
        assert direct.state is txmq.TransactionState.COMMITTED
        pending = producer.send_in_transaction(txmq.Message(topic, b"checked"))
        assert pending.state is txmq.TransactionState.PREPARED
        # The checker (mTLS to the name server and the broker) asks the producer (TLS).
        row = wait_state(secure, pending.transaction_id, COMMITTED, timeout=20)
    assert row.resolution_source == common_pb2.TRANSACTION_SOURCE_CHECK
    assert listener.checked == [pending.transaction_id]
    bodies: list[bytes] = []
    with txmq.SimpleConsumer(secure.nameserver_address, consumer_group=unique_name("c"),
                             subscriptions={topic: "*"}, await_duration_seconds=0.5, tls=tls) as consumer:
        def both() -> bool:
            for m in consumer.receive(8):
                bodies.append(m.body)
                consumer.ack(m)
            return len(bodies) >= 2
        wait_until(both, 15, message=lambda: f"received so far: {bodies}")
    assert sorted(bodies) == [b"checked", b"direct"]
    assert describe(secure, direct.transaction_id).state == COMMITTED


def test_the_asyncio_sdk_runs_a_checked_transaction_over_mutual_tls(secure, unique_name):
    import asyncio

    from txmq.aio import AsyncSimpleConsumer, AsyncTransactionListener, AsyncTransactionProducer

    group, topic = unique_name("g"), unique_name("orders")
    secure.create_topic(topic, 1)
    tls = secure.client_tls()
    checked: list[str] = []

    class AsyncListener(AsyncTransactionListener):
        async def execute_local_transaction(self, message, arg):
            return LocalState.UNKNOWN

        async def check_local_transaction(self, message):
            checked.append(message.transaction_id)
            return LocalState.COMMIT

    async def main() -> tuple[txmq.TransactionResult, list[bytes]]:
        async with AsyncTransactionProducer(secure.nameserver_address, producer_group=group, listener=AsyncListener(),
                                            checker_refresh_seconds=0.5, tls=tls) as producer:
            pending = await producer.send_in_transaction(txmq.Message(topic, b"async-checked"))
            bodies: list[bytes] = []
            async with AsyncSimpleConsumer(secure.nameserver_address, consumer_group=unique_name("c"),
                                           subscriptions={topic: "*"}, await_duration_seconds=0.5,
                                           tls=tls) as consumer:
                deadline = time.monotonic() + 20
                while not bodies:
                    assert time.monotonic() < deadline, "the checked transaction never arrived"
                    for m in await consumer.receive(8):
                        bodies.append(m.body)
                        await consumer.ack(m)
            return pending, bodies

    pending, bodies = asyncio.run(main())
    assert pending.state is txmq.TransactionState.PREPARED
    assert bodies == [b"async-checked"]
    assert checked == [pending.transaction_id]  # answered over the TLS check stream


def test_clients_without_a_valid_certificate_are_refused(secure, pki, tmp_path, unique_name):
    address = secure.nameserver_address
    # The control: a certificate from the cluster's CA is accepted.
    good = pki.issue("good-client", directory=tmp_path)
    assert "broker-0" in list_brokers(address, credentials(pki.cert_file, good))

    other = CertificateAuthority(tmp_path / "other", name="other-ca")
    refused = {
        "plaintext": None,
        "TLS without a client certificate": credentials(pki.cert_file),
        "a certificate from another CA": credentials(pki.cert_file, other.issue("intruder")),
        "an expired certificate": credentials(pki.cert_file, pki.issue("late", expired=True, directory=tmp_path)),
        "a client that does not trust the server's CA": credentials(other.cert_file, other.issue("stranger")),
    }
    for what, creds in refused.items():
        with pytest.raises(grpc.RpcError) as info:
            list_brokers(address, creds)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE, what

    # The SDK without TLS gets the same refusal as an error of its own.
    with txmq.Producer(address, request_timeout_seconds=2) as plain:
        with pytest.raises(txmq.UnavailableError):
            plain.send(txmq.Message(unique_name("t"), b"x"))
    # And with the wrong CA's certificate.
    stranger = other.issue("stranger2")
    tls = txmq.TLS(ca_file=pki.cert_file, cert_file=stranger.cert_file, key_file=stranger.key_file)
    with txmq.Producer(address, request_timeout_seconds=2, tls=tls) as wrong:
        with pytest.raises(txmq.UnavailableError):
            wrong.send(txmq.Message(unique_name("t"), b"x"))


def test_a_rotated_server_certificate_is_served_without_a_restart_while_traffic_flows(secure, pki, tmp_path,
                                                                                    unique_name):
    topic = unique_name("t")
    secure.create_topic(topic, 2)
    nameserver, broker = secure.nameservers[0], secure.brokers[0]
    admin = secure.client_certificate
    before = {p.name: served_serial(p.address, pki.cert_file, admin) for p in (nameserver, broker)}
    assert before == {p.name: secure.certificates[p.name].serial for p in (nameserver, broker)}
    pids = {p.name: p.pid for p in (nameserver, broker)}

    stop = threading.Event()
    sent: list[int] = []
    handshakes: list[int] = []
    failures: list[BaseException] = []

    def send() -> None:  # one long-lived client
        with txmq.Producer(secure.nameserver_address, tls=secure.client_tls()) as producer:
            while not stop.is_set():
                try:
                    producer.send(txmq.Message(topic, b"during rotation"))
                    sent.append(1)
                except BaseException as exc:  # noqa: BLE001 - every failure is reported
                    failures.append(exc)

    def connect() -> None:  # a new connection (a new handshake) each time
        creds = credentials(pki.cert_file, admin)
        while not stop.is_set():
            try:
                assert "broker-0" in list_brokers(nameserver.address, creds)
                handshakes.append(1)
            except BaseException as exc:  # noqa: BLE001
                failures.append(exc)

    threads = [threading.Thread(target=send), threading.Thread(target=connect)]
    for t in threads:
        t.start()
    try:
        wait_until(lambda: len(sent) >= 20 and len(handshakes) >= 5, 20, message="no traffic before the rotation")
        rotated = {}
        for proc in (nameserver, broker):
            new = pki.issue(f"{proc.name}-rotated", directory=tmp_path)
            current = secure.certificates[proc.name]
            install(new, current.cert_file, current.key_file)
            rotated[proc.name] = new.serial
        for proc in (nameserver, broker):
            wait_until(lambda: served_serial(proc.address, pki.cert_file, admin) == rotated[proc.name], 15,
                       message=f"{proc.name} still serves its old certificate")
        mark_sent, mark_handshakes = len(sent), len(handshakes)
        wait_until(lambda: len(sent) >= mark_sent + 20 and len(handshakes) >= mark_handshakes + 5, 20,
                   message="traffic stopped after the rotation")
        # The broker's own certificate (its client side too) keeps its registration beating.
        secure.wait_brokers_registered(heartbeat_after_ms=int(time.time() * 1000))
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert failures == []
    assert {p.name: p.pid for p in (nameserver, broker)} == pids  # no restart


def test_a_replicated_shard_replicates_and_elects_over_mutual_tls(tmp_path, pki, unique_name):
    with Cluster(tmp_path / "replicated", broker_env=TEST_BROKER_ENV, replication_factor=3, tls=pki) as c:
        assert c.etcd is not None and c.etcd.endpoint.startswith("https://")
        leader = c.wait_leaders()["broker-0"]
        topic = unique_name("t")
        c.create_topic(topic, 2)
        with txmq.Producer(c.nameserver_address, tls=c.client_tls()) as producer:
            for i in range(10):
                producer.send(txmq.Message(topic, b"%d" % i))

        def all_in_sync() -> bool:
            listed = {b.name: b for b in c.list_brokers()}
            return len(listed["broker-0"].replication.in_sync_replicas) == 3
        wait_until(all_in_sync, 20, message="the followers did not join the in-sync set over TLS",
                   ignore=(grpc.RpcError,))
        # The replication port serves TLS only, with the gRPC port's client-certificate rule
        # and reloading (ssl contexts built here, as a follower's are).
        address = replication_address(leader)
        frames, closed = exchange(address, replog.encode_hello("broker-0", 1, 0, 0, 0))
        assert frames == [] and closed, "a plaintext hello must get nothing back"
        for client in (None, CertificateAuthority(tmp_path / "other-ca").issue("test-admin")):
            try:  # no client certificate / another CA's: the handshake fails (TLS 1.3: at the first read)
                frames, closed = exchange(address, replog.encode_hello("broker-0", 1, 0, 0, 0),
                                          context=tls_context(pki, client))
            except (ssl.SSLError, ConnectionError):
                continue
            assert frames == [] and closed, f"the replication port answered a client certificate {client}"
        context = tls_context(pki, c.client_certificate)
        with pytest.raises(Refused) as refused:  # TLS works: the session's own check answers
            open_session(address, "broker-0", 9, 0, context=context)
        assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
        rotated = pki.issue(leader.name, directory=tmp_path / "rotated")
        install(rotated, leader.env["TXMQ_TLS_CERT_FILE"], leader.env["TXMQ_TLS_KEY_FILE"])
        wait_until(lambda: peer_serial(address, context) == rotated.serial, 10,
                   message="the replication port did not serve the rotated certificate")
        # A failover: the new leader is elected in etcd (TLS) and followed over TLS.
        leader.kill()
        new = c.wait_leaders(not_on=leader, timeout=30)["broker-0"]
        assert new is not leader
        with txmq.Producer(c.nameserver_address, tls=c.client_tls()) as producer:
            producer.send(txmq.Message(topic, b"after failover"))


def tls_context(pki: CertificateAuthority, client) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=pki.cert_file)
    if client is not None:
        context.load_cert_chain(client.cert_file, client.key_file)
    return context


def peer_serial(address: tuple[str, int], context: ssl.SSLContext) -> int:
    import socket
    with socket.create_connection(address, timeout=5) as raw:
        with context.wrap_socket(raw, server_hostname=address[0]) as tls:
            return int(tls.getpeercert()["serialNumber"], 16)


def test_the_health_port_answers_probes_in_plaintext_and_serves_nothing_else(secure):
    """Kubernetes' gRPC probes cannot speak TLS: TXMQ_HEALTH_PORT serves grpc.health.v1 alone."""
    broker = secure.brokers[0]
    health = f"127.0.0.1:{broker.ready_info['health_port']}"
    with grpc.insecure_channel(health) as channel:
        status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5).status
        assert status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as info:
            nameserver_pb2_grpc.NameServerServiceStub(channel).ListBrokers(nameserver_pb2.ListBrokersRequest(),
                                                                           timeout=5)
        assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
    with pytest.raises(grpc.RpcError) as info:  # the gRPC port itself: TLS only
        with grpc.insecure_channel(broker.address) as channel:
            health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE


def test_the_proxy_serves_tls_and_reaches_the_cluster_over_mutual_tls(secure, pki, unique_name):
    """A RocketMQ 5 client's first call, over TLS: the proxy answers it from the name servers
    it reaches over mutual TLS, presenting its own certificate."""
    from services.proxy.protocol import Code, definition_pb2, service_pb2, service_pb2_grpc

    topic = unique_name("t")
    secure.create_topic(topic, 2)
    host, port = secure.proxy_addresses[0].rsplit(":", 1)
    request = service_pb2.QueryRouteRequest(
        topic=definition_pb2.Resource(name=topic),
        endpoints=definition_pb2.Endpoints(scheme=definition_pb2.IPv4,
                                           addresses=[definition_pb2.Address(host=host, port=int(port))]))
    with grpc.secure_channel(secure.proxy_addresses[0], credentials(pki.cert_file, secure.client_certificate)) as ch:
        route = service_pb2_grpc.MessagingServiceStub(ch).QueryRoute(request, timeout=10)
    assert route.status.code == Code.OK, route.status
    assert len(route.message_queues) == 2
    with pytest.raises(grpc.RpcError) as info:
        with grpc.insecure_channel(secure.proxy_addresses[0]) as ch:
            service_pb2_grpc.MessagingServiceStub(ch).QueryRoute(request, timeout=5)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE


def test_a_half_written_rotation_keeps_the_previous_certificate_until_the_key_matches(secure, pki, tmp_path):
    checker = secure.checkers[0]
    current = secure.certificates[checker.name]
    admin = secure.client_certificate
    old = served_serial(checker.address, pki.cert_file, admin)
    new = pki.issue("checker-next", directory=tmp_path)
    log_start = checker.log_size()
    Path(current.cert_file).write_bytes(Path(new.cert_file).read_bytes())  # the key not yet
    # Each new handshake (and the checker's own channels) sees the mismatch, keeps the old pair.
    wait_until(lambda: served_serial(checker.address, pki.cert_file, admin) == old
               and "cannot be used" in checker.log_tail(50, since=log_start), 10,
               message="the mismatched pair was not noticed")
    registered_at = int(time.time() * 1000)
    secure.wait_brokers_registered(heartbeat_after_ms=registered_at)
    assert "Failed to create security handshaker" not in checker.log_tail(200, since=log_start)
    Path(current.key_file).write_bytes(Path(new.key_file).read_bytes())
    wait_until(lambda: served_serial(checker.address, pki.cert_file, admin) == new.serial, 10,
               message="the completed rotation was not taken")
