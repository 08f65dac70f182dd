"""The official RocketMQ 5 clients (unmodified, in subprocesses) through a proxy that serves
TLS, as the chart runs it: every service with a certificate of the test CA (mutual TLS
between services), the proxy's clients without one (``TXMQ_TLS_CLIENT_AUTH=none``). The
clients dial TLS (Python ``tls_enable=True``, Node ``sslEnabled: true``) and trust the test
CA the way a user makes them: GRPC_DEFAULT_SSL_ROOTS_FILE_PATH (both clients' gRPC reads
it), or for Node NODE_EXTRA_CA_CERTS. A plaintext client is refused before any call."""

from __future__ import annotations

from typing import Callable, Iterator

import pytest

from tests.support.certs import CertificateAuthority
from tests.support.cluster import Cluster
from tests.support.metrics import metric_sum
from tests.support.waiting import wait_until
from txmq.v1 import common_pb2

from .conftest import BROKER_ENV, CHECKER_ENV, PROXY_ENV
from .support import Clients, Environment, node_ready
from .test_python_client import transaction_of

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    ca = CertificateAuthority(tmp_path_factory.mktemp("pki"))
    c = Cluster(tmp_path_factory.mktemp("proxy-tls"), broker_env=BROKER_ENV, checker=True,
                checker_env=CHECKER_ENV, proxies=1, proxy_env={**PROXY_ENV, "TXMQ_TLS_CLIENT_AUTH": "none"},
                nameserver_env={"TXMQ_AUTO_CREATE_TOPICS": "true"}, tls=ca)
    try:
        yield c
    finally:
        c.stop()


def grpc_roots(cluster: Cluster) -> Environment:
    """Trust the cluster's CA alone: gRPC's roots file, read by grpc (Python) and grpc-js."""
    assert cluster.ca is not None
    return {"GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": cluster.ca.cert_file}


def node_extra_ca(cluster: Cluster) -> Environment:
    """Node's roots plus the cluster's CA; grpc-js uses Node's roots only while
    GRPC_DEFAULT_SSL_ROOTS_FILE_PATH is unset (set, it replaces them)."""
    assert cluster.ca is not None
    return {"NODE_EXTRA_CA_CERTS": cluster.ca.cert_file, "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": None}


def test_python_client_commits_a_checked_transaction_and_consumes_over_tls(
        secure: Cluster, clients: Clients, unique_name: Callable[[str], str]) -> None:
    """One transaction committed by the producer; one left unknown, which the broker's check
    asks the producer's TransactionChecker about over the TLS Telemetry stream, and which its
    answer commits. A SimpleConsumer over TLS receives and acknowledges both."""
    topic, group = unique_name("tls-tx"), unique_name("g")
    proxy = secure.proxy_addresses[0]  # 127.0.0.1: the certificate's IP SAN
    producer = clients.python("transactional", env=grpc_roots(secure), endpoints=proxy, tls=True, topic=topic,
                              bodies=["commit-1", "unknown-1"])
    sent = {e["body"]: e for e in producer.wait_event("sent", count=2)}
    [checked] = producer.wait_event("checked")
    assert checked["message_id"] == sent["unknown-1"]["message_id"] and checked["resolution"] == "COMMIT"
    # The producer stays up until its answer is applied (its shutdown could cancel it).
    txn = wait_until(lambda: (t := transaction_of(secure, sent["unknown-1"]["transaction_id"])).state
                     == common_pb2.TRANSACTION_STATE_COMMITTED and t, 30,
                     message="the checked transaction was not committed")
    assert txn.resolution_source == common_pb2.TRANSACTION_SOURCE_CHECK
    producer.expect_success(60)
    assert [e["body"] for e in producer.of("ended")] == ["commit-1"]  # the producer decided only that one

    consumer = clients.python("simple", env=grpc_roots(secure), endpoints=proxy, tls=True, topic=topic, group=group,
                              count=2, await_seconds=1)
    consumer.expect_success(60)
    received = consumer.of("received")
    assert sorted(m["body"] for m in received) == ["commit-1", "unknown-1"]
    assert {m["message_id"] for m in received} == {e["message_id"] for e in sent.values()}
    assert consumer.of("done") == [{"event": "done", "acked": 2}]


@pytest.mark.skipif(node_ready() is not None, reason=node_ready() or "")
@pytest.mark.parametrize("trust", [grpc_roots, node_extra_ca])
def test_node_client_sends_and_receives_over_tls(secure: Cluster, clients: Clients, unique_name: Callable[[str], str],
                                                 trust: Callable[[Cluster], Environment]) -> None:
    topic, group = unique_name("tls-node"), unique_name("g")
    port = secure.proxy_addresses[0].rsplit(":", 1)[1]
    proxy = f"localhost:{port}"  # the certificate's DNS SAN; routes name it back
    sender = clients.node("rmq_node.js", "send", env=trust(secure), endpoints=proxy, tls=True, topic=topic,
                          bodies=["node-1"])
    sender.expect_success(60)
    consumer = clients.node("rmq_node.js", "simple", env=trust(secure), endpoints=proxy, tls=True, topic=topic,
                            group=group, count=1, await_seconds=1)
    consumer.expect_success(60)
    [m] = consumer.of("received")
    assert m["body"] == "node-1" and m["message_id"] == sender.of("sent")[0]["message_id"]


def test_a_plaintext_client_is_refused_before_any_call(secure: Cluster, clients: Clients,
                                                       unique_name: Callable[[str], str]) -> None:
    """The official Python client without ``tls_enable`` fails at its first call (UNAVAILABLE
    in its log: the proxy closes a connection that does not start with a TLS handshake), and
    the proxy serves none of its calls; the same client with ``tls_enable`` sends."""
    topic = unique_name("tls-plain")
    proxy = secure.proxy_addresses[0]
    port = secure.proxies[0].metrics_port

    def served() -> float:
        return metric_sum(port, "txmq_rpc_duration_seconds_count", {"service": "proxy"})

    before = served()
    plaintext = clients.python("send", env=grpc_roots(secure), endpoints=proxy, topic=topic, bodies=["plaintext"])
    assert plaintext.finish(60) != 0
    assert plaintext.of("sent") == []
    [error] = plaintext.of("error")
    assert f"failed to fetch topic:{topic} route" in error["message"], error
    assert "StatusCode.UNAVAILABLE" in clients.logs(), clients.logs()[-2000:]
    assert served() == before
    assert metric_sum(port, "txmq_proxy_messages_in_total", {"topic": topic}) == 0

    clients.python("send", env=grpc_roots(secure), endpoints=proxy, tls=True, topic=topic,
                   bodies=["tls"]).expect_success(60)
    assert served() > before
    assert metric_sum(port, "txmq_proxy_messages_in_total", {"topic": topic}) == 1
