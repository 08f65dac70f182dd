"""Principals from mutual-TLS client certificates: with TLS and auth on, the services know
each other by their certificates (no tokens at all), a client's certificate names its
principal, and the ACL applies to it as to a token's."""

from __future__ import annotations

import json
import ssl
from typing import Any, Iterator

import grpc
import pytest

import txmq
from tests.conftest import TEST_BROKER_ENV
from tests.support.certs import CertificateAuthority
from services.broker.transport import Refused
from tests.support.cluster import Cluster
from tests.support.replicas import wait_in_sync
from tests.support.replstream import open_session, replication_address
from tests.integration.test_tls import CHECKER_ENV, pki  # noqa: F401 - the module's CA fixture
from tests.support.waiting import wait_until
from txmq.v1 import admin_pb2, common_pb2, nameserver_pb2, nameserver_pb2_grpc


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory, pki: CertificateAuthority) -> Iterator[Cluster]:
    workdir = tmp_path_factory.mktemp("auth-mtls")
    creds = workdir / "credentials.json"
    creds.write_text(json.dumps({
        "principals": {
            "nameserver": {"service": True, "certificates": ["nameserver"]},
            "broker": {"service": True, "certificates": ["broker-0"]},
            "checker": {"service": True, "certificates": ["checker-0"]},
            "operator": {"certificates": ["test-admin"]},
            "orders": {"certificates": ["orders-app"]},
            "mallory": {"certificates": ["mallory"]},
        },
        "acl": [
            {"principal": "operator", "resource": "cluster", "actions": ["admin-read", "admin-write", "subscribe"]},
            {"principal": "orders", "resource": "topic:orders", "actions": ["publish"]},
            {"principal": "orders", "resource": "producer_group:orders", "actions": ["check"]},
        ]}))
    env = {"TXMQ_AUTH_FILES": str(creds)}
    cluster = Cluster(workdir, nameserver_env=env, broker_env={**TEST_BROKER_ENV, **env}, checker=True,
                      checker_env={**CHECKER_ENV, **env}, tls=pki)
    try:
        cluster.create_topic("orders", queue_count=1)
        yield cluster
    finally:
        cluster.stop()


def client_tls(pki: CertificateAuthority, tmp_path: Any, name: str) -> txmq.TLS:
    cert = pki.issue(name, directory=tmp_path)
    return txmq.TLS(ca_file=pki.cert_file, cert_file=cert.cert_file, key_file=cert.key_file)


def register_as(cluster: Cluster, pki: CertificateAuthority, tmp_path: Any, name: str) -> grpc.StatusCode:
    cert = pki.issue(name, directory=tmp_path)
    with open(pki.cert_file, "rb") as ca, open(cert.key_file, "rb") as key, open(cert.cert_file, "rb") as crt:
        credentials = grpc.ssl_channel_credentials(ca.read(), key.read(), crt.read())
    with grpc.secure_channel(cluster.nameserver_address, credentials) as channel:
        try:
            nameserver_pb2_grpc.NameServerServiceStub(channel).RegisterBroker(nameserver_pb2.RegisterBrokerRequest(
                broker=nameserver_pb2.BrokerInfo(name="broker-0", address="10.9.9.9:10911")), timeout=5)
        except grpc.RpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK


def test_services_and_clients_are_known_by_their_certificates(secured: Cluster, pki: CertificateAuthority,
                                                              tmp_path: Any) -> None:
    class CommitOnCheck(txmq.TransactionListener):
        def execute_local_transaction(self, message: Any, arg: Any) -> Any:
            return txmq.LocalTransactionState.UNKNOWN

        def check_local_transaction(self, message: Any) -> Any:
            return txmq.LocalTransactionState.COMMIT

    # The checker's check (checker → broker and name server as "checker", by certificate)
    # reaches the producer, whose certificate makes it "orders".
    with txmq.TransactionProducer(secured.nameserver_address, producer_group="orders", listener=CommitOnCheck(),
                                  tls=client_tls(pki, tmp_path, "orders-app")) as producer:
        result = producer.send_in_transaction(txmq.Message("orders", b"checked"))

        def committed() -> bool:
            return secured.admin_stub().DescribeTransaction(admin_pb2.DescribeTransactionRequest(
                transaction_id=result.transaction_id), timeout=5).transaction.state == \
                common_pb2.TRANSACTION_STATE_COMMITTED
        wait_until(committed, 30.0, message="the check never committed the transaction")

    # A certificate of the right CA whose name no principal has, and a known one without the right.
    assert register_as(secured, pki, tmp_path, "stranger") == grpc.StatusCode.UNAUTHENTICATED
    assert register_as(secured, pki, tmp_path, "mallory") == grpc.StatusCode.PERMISSION_DENIED
    assert register_as(secured, pki, tmp_path, "orders-app") == grpc.StatusCode.PERMISSION_DENIED
    assert [(b.name, b.address) for b in secured.list_brokers()] == [("broker-0", secured.broker(0).address)]
    with txmq.Producer(secured.nameserver_address, tls=client_tls(pki, tmp_path, "mallory"), max_attempts=1) as p:
        with pytest.raises(txmq.PermissionDeniedError) as denied:
            p.send(txmq.Message("orders", b"forged"))
    assert denied.value.principal == "mallory" and "orders" in denied.value.message


def test_replicas_replicate_by_certificate_and_the_port_admits_only_service_identities(
        tmp_path: Any, pki: CertificateAuthority) -> None:
    """A replicated shard with TLS and auth on and no tokens: the followers are known to the
    leader's replication port by their certificates alone (the broker, a service identity);
    a certificate nobody has is UNAUTHENTICATED there, a known non-service one
    PERMISSION_DENIED."""
    creds = tmp_path / "credentials.json"
    creds.write_text(json.dumps({"principals": {
        "nameserver": {"service": True, "certificates": ["nameserver"]},
        "broker": {"service": True, "certificates": ["broker-0-r0", "broker-0-r1", "broker-0-r2"]},
        "operator": {"certificates": ["test-admin"]},
        "mallory": {"certificates": ["mallory"]}},
        "acl": [{"principal": "operator", "resource": "cluster", "actions": ["admin-read", "admin-write"]}]}))
    env = {"TXMQ_AUTH_FILES": str(creds)}
    with Cluster(tmp_path / "c", nameserver_env=env, broker_env={**TEST_BROKER_ENV, **env}, tls=pki,
                 replication_factor=3) as cluster:
        wait_in_sync(cluster, "broker-0", replicas=3, timeout=30)
        leader = cluster.leader("broker-0")
        assert leader is not None
        epoch = {b.name: b for b in cluster.list_brokers()}["broker-0"].leader_epoch
        for name, code in (("stranger", grpc.StatusCode.UNAUTHENTICATED),
                           ("mallory", grpc.StatusCode.PERMISSION_DENIED)):
            cert = pki.issue(name, directory=tmp_path)
            context = ssl.create_default_context(cafile=pki.cert_file)
            context.load_cert_chain(cert.cert_file, cert.key_file)
            with pytest.raises(Refused) as refused:
                open_session(replication_address(leader), "broker-0", 1, epoch, context=context)
            assert refused.value.code == code, refused.value
        wait_in_sync(cluster, "broker-0", replicas=3, timeout=30)  # the real followers never left
