"""The official RocketMQ 5 clients (unmodified, in subprocesses) against a cluster with auth
on: their signed requests (MQv2-HMAC-SHA1 under an access key's secret) are verified by the
proxy against the credential store and held to the ACL; a wrong secret is refused with
UNAUTHORIZED (40100), a topic the key may not use with FORBIDDEN (40300). The proxy calls
the native services as its own service identity."""

from __future__ import annotations

import json
from typing import Any, Callable, Iterator

import pytest

from services.common.auth import hash_token
from tests.support.cluster import Cluster
from tests.support.metrics import metric_sum
from tests.support.waiting import wait_until
from txmq.v1 import admin_pb2, common_pb2

from .conftest import BROKER_ENV, CHECKER_ENV, PROXY_ENV
from .support import Clients, node_ready

pytestmark = pytest.mark.timeout(180)

SERVICES = ("nameserver", "broker", "checker", "proxy", "operator")
ACCESS_KEY = "AK-APP"
SECRET = "app-secret-0123456789"
#: A principal that may publish to the topics but not answer their checks.
PUBLISHER_KEY = "AK-PUBLISHER"
#: The app's key for Python clients on hosts 8 hours east of UTC (they stamp local time).
EAST_KEY = "AK-EAST"
#: A POSIX TZ (no time zone database needed) 8 hours east of UTC, and the same as an offset.
EAST_TZ, EAST_OFFSET = "CST-8", "+08:00"


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    workdir = tmp_path_factory.mktemp("proxy-auth")
    tokens = {name: f"{name}-token-0123456789abcdef" for name in SERVICES}
    creds = workdir / "credentials.json"
    creds.write_text(json.dumps({
        "principals": {**{name: {"service": name != "operator", "tokens": [hash_token(t)]}
                          for name, t in tokens.items()}, "app": {}, "publisher": {}},
        "acl": [
            {"principal": "operator", "resource": "cluster", "actions": ["admin-read", "admin-write", "subscribe"]},
            {"principal": "app", "resource": "topic:auth-*", "actions": ["publish", "subscribe"]},
            {"principal": "app", "resource": "producer_group:auth-*", "actions": ["check"]},
            {"principal": "app", "resource": "consumer_group:auth-*", "actions": ["subscribe"]},
            {"principal": "publisher", "resource": "topic:auth-*", "actions": ["publish"]},
        ]}))
    # The secrets are in a file of their own, which only the proxy reads.
    keys = workdir / "access-keys.json"
    keys.write_text(json.dumps({"access_keys": {ACCESS_KEY: {"principal": "app", "secret": SECRET},
                                                PUBLISHER_KEY: {"principal": "publisher", "secret": SECRET},
                                                EAST_KEY: {"principal": "app", "secret": SECRET,
                                                           "time_zone": EAST_OFFSET}}}))
    env = {}
    for name in SERVICES:
        (workdir / f"{name}.token").write_text(tokens[name])
        env[name] = {"TXMQ_AUTH_FILES": str(creds), "TXMQ_AUTH_TOKEN_FILE": str(workdir / f"{name}.token")}
    env["proxy"]["TXMQ_AUTH_FILES"] += f",{keys}"
    cluster = Cluster(workdir, broker_env={**BROKER_ENV, **env["broker"]}, checker=True,
                      checker_env={**CHECKER_ENV, **env["checker"]}, proxies=2,
                      proxy_env={**PROXY_ENV, **env["proxy"]},
                      nameserver_env={"TXMQ_AUTO_CREATE_TOPICS": "true", **env["nameserver"]},
                      token=tokens["operator"])
    try:
        yield cluster
    finally:
        cluster.stop()


def state_of(cluster: Cluster, transaction_id: str) -> int:
    return cluster.admin_stub().DescribeTransaction(admin_pb2.DescribeTransactionRequest(
        transaction_id=transaction_id), timeout=5).transaction.state


def signed(**args: Any) -> dict[str, Any]:
    return {"access_key": ACCESS_KEY, "secret": SECRET, **args}


def test_signed_transactions_and_consumers(secured: Cluster, clients: Clients,
                                           unique_name: Callable[[str], str]) -> None:
    topic, group = unique_name("auth-tx"), unique_name("auth-g")
    proxy = secured.proxy_addresses[0]
    producer = clients.python("transactional", **signed(endpoints=proxy, topic=topic,
                                                        bodies=["commit-1", "rollback-1", "commit-2"]))
    producer.expect_success(60)
    sent = {e["body"]: e for e in producer.of("sent")}
    assert set(sent) == {"commit-1", "rollback-1", "commit-2"}
    consumer = clients.python("simple", **signed(endpoints=proxy, topic=topic, group=group, count=2, await_seconds=1))
    consumer.expect_success(60)
    assert sorted(m["body"] for m in consumer.of("received")) == ["commit-1", "commit-2"]
    assert state_of(secured, sent["rollback-1"]["transaction_id"]) == common_pb2.TRANSACTION_STATE_ROLLED_BACK


def test_signed_orphan_recovered_through_another_proxy(secured: Cluster, clients: Clients,
                                                       unique_name: Callable[[str], str]) -> None:
    topic = unique_name("auth-orphan")
    first = clients.python("orphan", **signed(endpoints=secured.proxy_addresses[0], topic=topic,
                                              body="orphan-commit"))
    sent = first.wait_event("sent", timeout=60)[0]
    assert first.finish(30, close_stdin=False) == -9
    second = clients.python("checker", **signed(endpoints=secured.proxy_addresses[1], topic=topic))
    checked = second.wait_event("checked", timeout=60)[0]
    assert checked["message_id"] == sent["message_id"]
    # Up until its answer is applied (its shutdown may cancel an answer not yet sent).
    wait_until(lambda: state_of(secured, sent["transaction_id"]) == common_pb2.TRANSACTION_STATE_COMMITTED, 30,
               message="the orphan was not committed")
    second.expect_success(60)


def test_checks_go_only_to_producers_that_may_answer_them(secured: Cluster, clients: Clients,
                                                          unique_name: Callable[[str], str]) -> None:
    """A producer allowed to publish to a topic but without ``check`` on its group is sent
    none of its checks (which carry the half message): the check stays due until a producer
    that may answer connects."""
    topic = unique_name("auth-pub")
    publisher = clients.python("checker", endpoints=secured.proxy_addresses[0], topic=topic,
                               access_key=PUBLISHER_KEY, secret=SECRET)
    publisher.wait_event("started", timeout=60)
    first = clients.python("orphan", **signed(endpoints=secured.proxy_addresses[0], topic=topic, body="orphan"))
    sent = first.wait_event("sent", timeout=60)[0]
    assert first.finish(30, close_stdin=False) == -9
    port = secured.brokers[0].metrics_port
    wait_until(lambda: metric_sum(port, "txmq_check_due_oldest_age_seconds", {"group": topic}) >= 2.0, 30,
               message="the check never stayed due: someone took it")
    assert publisher.of("checked") == []
    answering = clients.python("checker", **signed(endpoints=secured.proxy_addresses[0], topic=topic))
    answering.wait_event("checked", timeout=60)
    wait_until(lambda: state_of(secured, sent["transaction_id"]) == common_pb2.TRANSACTION_STATE_COMMITTED, 30,
               message="the orphan was not committed")
    assert publisher.of("checked") == []
    answering.expect_success(60)
    publisher.expect_success(60)


def refusals(clients: Clients, client: Any, code: int) -> int:
    """How many refusals with RocketMQ status ``code`` the official client logged (under its
    HOME) once it failed; the failure itself was reported on stdout."""
    assert client.finish(60) != 0, "the client succeeded"
    assert client.of("error"), client.describe()
    return clients.logs().count(f"exception, {code}, ")


def test_wrong_secret_is_refused(secured: Cluster, clients: Clients, unique_name: Callable[[str], str]) -> None:
    topic = unique_name("auth-wrong")
    producer = clients.python("transactional", endpoints=secured.proxy_addresses[0], topic=topic,
                              access_key=ACCESS_KEY, secret="not-the-secret", bodies=["commit-1"])
    seen = refusals(clients, producer, 40100)  # UNAUTHORIZED
    assert seen > 0
    assert producer.of("sent") == []
    unknown = clients.python("send", endpoints=secured.proxy_addresses[0], topic=topic,
                             access_key="AK-NOBODY", secret=SECRET, bodies=["x"])
    assert refusals(clients, unknown, 40100) > seen
    seen = refusals(clients, unknown, 40100)
    anonymous = clients.python("send", endpoints=secured.proxy_addresses[0], topic=topic, bodies=["x"])
    assert refusals(clients, anonymous, 40100) > seen


def test_topic_outside_the_acl_is_forbidden(secured: Cluster, clients: Clients,
                                            unique_name: Callable[[str], str]) -> None:
    producer = clients.python("send", **signed(endpoints=secured.proxy_addresses[0], topic=unique_name("other"),
                                               bodies=["x"]))
    assert refusals(clients, producer, 40300) > 0  # FORBIDDEN
    assert producer.of("sent") == []


@pytest.mark.skipif(node_ready() is not None, reason=node_ready() or "")
def test_node_client_signed_and_refused(secured: Cluster, clients: Clients, unique_name: Callable[[str], str]) -> None:
    topic, group = unique_name("auth-node"), unique_name("auth-g")
    proxy = secured.proxy_addresses[0]
    producer = clients.node("rmq_node.js", "transactional", **signed(endpoints=proxy, topic=topic,
                                                                     bodies=["commit-1", "rollback-1"]))
    producer.expect_success(60)
    consumer = clients.node("rmq_node.js", "simple", **signed(endpoints=proxy, topic=topic, group=group, count=1,
                                                              await_seconds=1))
    consumer.expect_success(60)
    assert [m["body"] for m in consumer.of("received")] == ["commit-1"]
    wrong = clients.node("rmq_node.js", "transactional", endpoints=proxy, topic=topic, access_key=ACCESS_KEY,
                         secret="not-the-secret", bodies=["commit-2"])
    assert wrong.finish(60) != 0
    assert wrong.of("sent") == []


def _signed_query_route(cluster: Cluster, topic: str, stamp: str, secret: str = SECRET) -> Any:
    """A QueryRoute signed as the official clients sign, over the given x-mq-date-time."""
    import hashlib
    import hmac

    from services.proxy.protocol import definition_pb2, service_pb2, service_pb2_grpc
    signature = hmac.new(secret.encode(), stamp.encode(), hashlib.sha1).hexdigest()
    import grpc
    with grpc.insecure_channel(cluster.proxy_addresses[0]) as channel:  # no token of the test's own
        return service_pb2_grpc.MessagingServiceStub(channel).QueryRoute(
            service_pb2.QueryRouteRequest(topic=definition_pb2.Resource(name=topic)), timeout=10,
            metadata=(("x-mq-client-id", "replayer"), ("x-mq-date-time", stamp), (
                "authorization", f"MQv2-HMAC-SHA1 Credential={ACCESS_KEY}, "
                                 f"SignedHeaders=x-mq-date-time, Signature={signature}")))


def test_a_replayed_signature_is_refused(secured: Cluster, unique_name: Callable[[str], str]) -> None:
    """A signed request's signature covers only its x-mq-date-time stamp: one captured an
    hour ago (or stamped an hour ahead) is refused UNAUTHORIZED, as a wrong secret is; a
    fresh one passes."""
    import datetime
    topic = unique_name("auth-replay")
    now = datetime.datetime.now(datetime.UTC)
    fresh = _signed_query_route(secured, topic, now.strftime("%Y%m%dT%H%M%SZ"))
    assert fresh.status.code == 20000, fresh.status
    for shift in (-3600, 3600, -901):
        stamp = (now + datetime.timedelta(seconds=shift)).strftime("%Y%m%dT%H%M%SZ")
        replayed = _signed_query_route(secured, topic, stamp)
        assert replayed.status.code == 40100, (shift, replayed.status)  # UNAUTHORIZED
        assert "signature_max_skew_seconds=900" in replayed.status.message, replayed.status.message
    garbled = _signed_query_route(secured, topic, "yesterday")
    assert garbled.status.code == 40100 and "x-mq-date-time" in garbled.status.message


def test_python_client_outside_utc_signs_local_time(secured: Cluster, clients: Clients,
                                                    unique_name: Callable[[str], str]) -> None:
    """The official Python client stamps its host's local time labelled Z: on a host 8 h
    east of UTC it works with a key whose time_zone says so, and is refused with a key that
    expects UTC (the refusal says why)."""
    topic, group = unique_name("auth-east"), unique_name("auth-g")
    proxy = secured.proxy_addresses[0]
    producer = clients.python("transactional", endpoints=proxy, topic=topic, access_key=EAST_KEY, secret=SECRET,
                              tz=EAST_TZ, bodies=["commit-1"])
    producer.expect_success(60)
    consumer = clients.python("simple", endpoints=proxy, topic=topic, group=group, count=1, await_seconds=1,
                              access_key=EAST_KEY, secret=SECRET, tz=EAST_TZ)
    consumer.expect_success(60)
    assert [m["body"] for m in consumer.of("received")] == ["commit-1"]
    utc_key = clients.python("send", **signed(endpoints=proxy, topic=topic, tz=EAST_TZ, bodies=["x"]))
    assert refusals(clients, utc_key, 40100) > 0
    assert utc_key.of("sent") == []
