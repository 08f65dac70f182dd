"""The credential store, the ACL and the policy tables, without a server."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from pathlib import Path
from typing import Any

import pytest

from services.common.auth import NATIVE, CredentialsError, CredentialStore, TokenFile, hash_token
from services.common.auth.acl import parse_resource
from services.common.auth.interceptor import authorize
from services.common.auth.policy import Policy
from services.common.auth.store import parse
from services.proxy.access import POLICIES
from services.proxy.protocol import service_pb2
from txmq import PermissionDeniedError
from txmq.v1 import (admin_pb2, broker_pb2, checker_pb2, common_pb2, nameserver_pb2, operations_pb2, replication_pb2)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def store_of(data: dict[str, Any]) -> Any:
    return parse([("credentials.yaml", data)])


BASE = {
    "principals": {"app": {"tokens": [hash_token("app-token")]}, "svc": {"service": True}},
    "access_keys": {"AK": {"principal": "app", "secret": "s3cret"}},
    "acl": [{"principal": "app", "resource": "topic:orders-*", "actions": ["publish"]},
            {"principal": "app", "resource": "consumer_group:g", "actions": ["subscribe"]}],
}


def test_tokens_are_looked_up_by_digest_and_signatures_verified() -> None:
    creds = store_of(BASE)
    assert creds.principal_for_token("app-token").name == "app"
    assert creds.principal_for_token("app-token ") is None
    assert "app-token" not in json.dumps([list(creds.by_token_hash)])
    signature = hmac.new(b"s3cret", b"20261124T200000Z", hashlib.sha1).hexdigest()
    assert creds.principal_for_signature("AK", "20261124T200000Z", signature).name == "app"
    assert creds.principal_for_signature("AK", "20261124T200000Z", signature.upper()).name == "app"  # Node
    assert creds.principal_for_signature("AK", "20261124T200001Z", signature) is None
    assert creds.principal_for_signature("AK2", "20261124T200000Z", signature) is None


@pytest.mark.parametrize(("data", "named"), [
    ({"principals": {"a": {"tokens": ["plain-text-token"]}}}, "sha256"),
    ({"principals": {"a": {"tokens": [hash_token("x")]}, "b": {"tokens": [hash_token("x")]}}}, "also"),
    ({"principals": {"a": {"tokenz": []}}}, "tokenz"),
    ({"acl": [{"principal": "nobody", "resource": "cluster", "actions": ["admin-read"]}]}, "not declared"),
    ({"principals": {"a": {}}, "acl": [{"principal": "a", "resource": "topic:x", "actions": ["delete"]}]}, "delete"),
    ({"principals": {"a": {}}, "acl": [{"principal": "a", "resource": "queue:x", "actions": ["publish"]}]}, "queue"),
    ({"principals": {"a": {}}, "acl": [{"principal": "a", "resource": "topic:a*b", "actions": ["publish"]}]}, "*"),
    ({"access_keys": {"AK": {"principal": "ghost", "secret": "s"}}}, "ghost"),
    ({"users": {}}, "users"),
    ({"principals": {"a": {}}, "access_keys": {"AK": {"principal": "a", "secret": "s", "time_zone": "Mars/Base"}}},
     "access_keys.AK.time_zone"),
    ({"principals": {"a": {}}, "access_keys": {"AK": {"principal": "a", "secret": "s", "time_zone": "+15:00"}}},
     "14:00"),
    ({"principals": {"a": {}}, "access_keys": {"AK": {"principal": "a", "secret": "s", "timezone": "UTC"}}},
     "timezone"),
])
def test_bad_files_are_refused_naming_the_entry(data: dict[str, Any], named: str) -> None:
    with pytest.raises(CredentialsError, match=None) as refused:
        store_of(data)
    assert named in str(refused.value)


def test_resources_by_name_prefix_and_cluster() -> None:
    assert parse_resource("topic:orders-*").covers("topic", "orders-eu")
    assert not parse_resource("topic:orders-*").covers("topic", "order")
    assert not parse_resource("topic:orders").covers("topic", "orders-eu")
    assert not parse_resource("topic:orders").covers("consumer_group", "orders")
    assert parse_resource("cluster").covers("producer_group", "anything")
    assert parse_resource("producer_group:*").covers("producer_group", "")


def test_default_deny_and_the_internal_role() -> None:
    creds = store_of(BASE)
    app, svc = creds.principals["app"], creds.principals["svc"]
    send = NATIVE["/txmq.v1.BrokerService/SendMessage"].rights
    allowed = broker_pb2.SendMessageRequest(message=common_pb2.Message(topic="orders-1", type=1))
    authorize(creds, app, "SendMessage", send(allowed))  # type: ignore[operator]
    with pytest.raises(PermissionDeniedError, match="'app' may not publish topic 'other'"):
        authorize(creds, app, "SendMessage", send(broker_pb2.SendMessageRequest(  # type: ignore[operator]
            message=common_pb2.Message(topic="other", type=1))))
    half = broker_pb2.SendMessageRequest(message=common_pb2.Message(
        topic="orders-1", type=common_pb2.MESSAGE_TYPE_TRANSACTION, producer_group="orders"))
    with pytest.raises(PermissionDeniedError, match="check producer_group 'orders'"):
        authorize(creds, app, "SendMessage", send(half))  # type: ignore[operator]
    authorize(creds, svc, "SendMessage", send(half))  # type: ignore[operator]
    # An operator's resolution at the broker, or one naming no group: service identities only.
    end = NATIVE["/txmq.v1.BrokerService/EndTransaction"].rights
    for request in (broker_pb2.EndTransactionRequest(source=common_pb2.TRANSACTION_SOURCE_OPERATOR),
                    broker_pb2.EndTransactionRequest(source=common_pb2.TRANSACTION_SOURCE_CLIENT)):
        with pytest.raises(PermissionDeniedError, match="service identities"):
            authorize(creds, app, "EndTransaction", end(request))  # type: ignore[operator]


def _methods(module: Any) -> list[str]:
    return [f"/{s.full_name}/{m.name}" for s in module.DESCRIPTOR.services_by_name.values() for m in s.methods]


def test_every_rpc_has_a_policy() -> None:
    """A new RPC without a line in the table would be refused to everyone but service
    identities: this says so before anyone finds out in production."""
    native = [m for mod in (admin_pb2, broker_pb2, checker_pb2, nameserver_pb2, operations_pb2, replication_pb2) for m in _methods(mod)]
    assert sorted(set(native) - set(NATIVE)) == []
    assert sorted(set(_methods(service_pb2)) - set(POLICIES)) == []
    assert all(isinstance(p, Policy) for p in [*NATIVE.values(), *POLICIES.values()])


def test_policies_read_their_requests() -> None:
    """Every request-reading policy runs on an empty request of its method (no typo in a
    field name hides until the first call)."""
    classes = {}
    for module in (admin_pb2, broker_pb2, checker_pb2, nameserver_pb2, replication_pb2, service_pb2):
        for service in module.DESCRIPTOR.services_by_name.values():
            for method in service.methods:
                classes[f"/{service.full_name}/{method.name}"] = getattr(module, method.input_type.name)
    for table in (NATIVE, POLICIES):
        for method, policy in table.items():
            if callable(policy.rights) and method in classes:
                policy.rights(classes[method]())


def test_the_store_reloads_a_changed_file_and_keeps_the_last_good_one(tmp_path: Path) -> None:
    path = tmp_path / "credentials.json"
    path.write_text(json.dumps(BASE))
    clock = Clock()
    store = CredentialStore([str(path)], reload_seconds=1.0, clock=clock)
    assert store.current().principal_for_token("new-token") is None
    changed = json.loads(json.dumps(BASE))
    changed["principals"]["app"]["tokens"].append(hash_token("new-token"))
    path.write_text(json.dumps(changed))
    os.utime(path, ns=(1, 1))  # a different mtime even within the filesystem's resolution
    assert store.current().principal_for_token("new-token") is None  # not looked at yet
    clock.now = 1.5
    assert store.current().principal_for_token("new-token").name == "app"
    path.write_text("{not json")
    clock.now = 3.0
    assert store.current().principal_for_token("new-token").name == "app"
    assert store.reloads == 1


def test_a_bad_file_stops_the_start(tmp_path: Path) -> None:
    path = tmp_path / "credentials.yaml"
    path.write_text("principals: [")
    with pytest.raises(CredentialsError, match="not valid YAML"):
        CredentialStore([str(path)])
    with pytest.raises(CredentialsError, match="missing.yaml"):
        CredentialStore([str(tmp_path / "missing.yaml")])


def test_a_service_token_file_is_read_again_when_it_changes(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("first\n")
    clock = Clock()
    token = TokenFile(str(path), reload_seconds=1.0, clock=clock)
    assert token.token() == "first"
    path.write_text("second-token\n")
    clock.now = 2.0
    assert token.token() == "second-token"
    path.write_text("")
    clock.now = 4.0
    assert token.token() == "second-token"  # an empty file: the last good token stays


def test_signed_stamps_must_be_fresh_in_the_keys_time_zone() -> None:
    """x-mq-date-time is read in the access key's zone (the Python client stamps local
    time); beyond signature_max_skew_seconds it is refused, saying when a whole zone is off."""
    import calendar

    from services.common.auth.interceptor import check_fresh
    from services.common.auth.store import AccessKey, parse_time_zone
    from txmq import UnauthenticatedError
    now = calendar.timegm((2026, 11, 24, 12, 0, 0))
    utc, east = AccessKey("app", "s"), AccessKey("app", "s", parse_time_zone("+08:00"))
    check_fresh("AK", utc, "20261124T120500Z", 900, now)
    check_fresh("AK", east, "20261124T200500Z", 900, now)  # 20:05 in +08:00 is 12:05 UTC
    check_fresh("AK", utc, "20261124T000000Z", 0, now)  # 0: no check (RocketMQ's own proxy)
    with pytest.raises(UnauthenticatedError, match="8h05m ahead of .*time_zone"):
        check_fresh("AK", utc, "20261124T200500Z", 900, now)
    with pytest.raises(UnauthenticatedError, match="0h16m behind"):
        check_fresh("AK", utc, "20261124T114400Z", 900, now)
    with pytest.raises(UnauthenticatedError, match="not a time"):
        check_fresh("AK", utc, "2026-11-24", 900, now)


# --- namespaces ---------------------------------------------------------------------------

_NAMED_FIELDS = {"topic", "consumer_group", "producer_group", "producer_groups"}


def _fill(message: Any, namespace: str, depth: int = 0) -> None:
    """Names every topic and group of ``message`` (at any depth; of a oneof, its first
    member) in ``namespace``: a txmq name ``<ns>%x``, or a RocketMQ Resource
    ``{resource_namespace: ns, name: x}``."""
    if message.DESCRIPTOR.full_name == "apache.rocketmq.v2.Resource":
        message.resource_namespace, message.name = namespace, "x"
        return
    for field in message.DESCRIPTOR.fields:
        if field.containing_oneof is not None and field.containing_oneof.fields[0] is not field:
            continue
        repeated = field.is_repeated
        if field.type == field.TYPE_STRING and field.name in _NAMED_FIELDS:
            if repeated:
                getattr(message, field.name).append(f"{namespace}%x")
            else:
                setattr(message, field.name, f"{namespace}%x")
        elif field.message_type is not None and depth < 4 and not field.message_type.GetOptions().map_entry:
            _fill(getattr(message, field.name).add() if repeated else getattr(message, field.name),
                  namespace, depth + 1)


def test_a_namespaced_rule_allows_its_namespace_and_refuses_the_other_on_every_rpc() -> None:
    """The census: every RPC whose policy names a topic or group, native and RocketMQ's,
    with every name in namespace A is allowed to a principal whose rules are scoped to A,
    and the same request in B is refused; what needs the whole cluster is refused too."""
    creds = store_of({"principals": {"alice": {}},
                      "acl": [{"principal": "alice", "namespace": "A", "resource": "cluster",
                               "actions": ["publish", "subscribe", "check", "admin-read", "admin-write"]}]})
    alice = creds.principals["alice"]
    classes = {}
    for module in (admin_pb2, broker_pb2, checker_pb2, nameserver_pb2, operations_pb2, service_pb2):
        for service in module.DESCRIPTOR.services_by_name.values():
            for method in service.methods:
                classes[f"/{service.full_name}/{method.name}"] = getattr(module, method.input_type.name)
    scoped, cluster_wide = [], []
    for table in (NATIVE, POLICIES):
        for method, policy in table.items():
            if not callable(policy.rights) or method not in classes:
                continue
            requests = {}
            for ns in ("A", "B"):
                requests[ns] = classes[method]()
                _fill(requests[ns], ns)
            needs = policy.rights(requests["A"])
            if not needs or any("internal" in n.actions for n in needs):
                continue
            if any(n.kind == "cluster" for n in needs):
                cluster_wide.append(method)
                with pytest.raises(PermissionDeniedError):
                    authorize(creds, alice, method, needs)
                continue
            scoped.append(method)
            authorize(creds, alice, method, needs)
            with pytest.raises(PermissionDeniedError, match="'B%x'"):
                authorize(creds, alice, method, policy.rights(requests["B"]))  # type: ignore[operator]
    # Every client RPC of both protocols is among them (a new one joins by itself).
    assert {"/txmq.v1.BrokerService/SendMessage", "/txmq.v1.BrokerService/Produce",
            "/txmq.v1.BrokerService/ReceiveMessages", "/txmq.v1.BrokerService/AckMessages",
            "/txmq.v1.CheckerService/CheckTransactionState", "/txmq.v1.AdminService/CreateTopic",
            "/apache.rocketmq.v2.MessagingService/SendMessage",
            "/apache.rocketmq.v2.MessagingService/ReceiveMessage",
            "/apache.rocketmq.v2.MessagingService/EndTransaction",
            "/apache.rocketmq.v2.MessagingService/Telemetry"} <= set(scoped)
    assert "/txmq.v1.AdminService/ListTopics" in cluster_wide


def test_namespaced_rules_match_names_within_their_namespace() -> None:
    creds = store_of({"principals": {"a": {}, "ops": {}},
                      "acl": [{"principal": "a", "namespace": "staging", "resource": "topic:orders-*",
                               "actions": ["publish"]},
                              {"principal": "ops", "resource": "topic:*", "actions": ["publish"]}]})
    from services.common.auth.acl import allows
    assert allows(creds.rules, "a", "publish", "topic", "staging%orders-1")
    assert not allows(creds.rules, "a", "publish", "topic", "prod%orders-1")
    assert not allows(creds.rules, "a", "publish", "topic", "orders-1")  # no namespace is not staging
    assert not allows(creds.rules, "a", "publish", "topic", "staging%other")
    assert allows(creds.rules, "ops", "publish", "topic", "prod%orders-1")  # unscoped: every namespace


@pytest.mark.parametrize(("rule", "named"), [
    ({"namespace": "bad ns"}, "acl[0].namespace"),
    ({"namespace": 7}, "acl[0].namespace"),
    ({"namespaces": "a"}, "optionally namespace"),
])
def test_a_bad_rule_namespace_is_refused(rule: dict[str, Any], named: str) -> None:
    with pytest.raises(CredentialsError) as refused:
        store_of({"principals": {"a": {}},
                  "acl": [{"principal": "a", "resource": "topic:x", "actions": ["publish"], **rule}]})
    assert named in str(refused.value)


def test_a_receive_carrying_acks_needs_every_right_their_ack_needs() -> None:
    """ReceiveMessages may carry acks (ack_receipt_handles): it must ask at least what an
    AckMessages of the same handles asks, whatever that becomes, and a principal allowed to
    receive for one group cannot settle another group's deliveries through it."""
    receive = NATIVE["/txmq.v1.BrokerService/ReceiveMessages"].rights
    ack = NATIVE["/txmq.v1.BrokerService/AckMessages"].rights
    for group, topic in (("billing", "orders-1"), ("other", "other")):
        carrying = broker_pb2.ReceiveMessagesRequest(consumer_group=group, topic=topic, ack_receipt_handles=["h"])
        acking = broker_pb2.AckMessagesRequest(consumer_group=group, topic=topic, receipt_handles=["h"])
        needs = receive(carrying)  # type: ignore[operator]
        assert all(need in needs for need in ack(acking))  # type: ignore[operator]
    creds = store_of(BASE)
    app = creds.principals["app"]
    with pytest.raises(PermissionDeniedError, match="consumer_group"):
        authorize(creds, app, "ReceiveMessages", receive(broker_pb2.ReceiveMessagesRequest(  # type: ignore[operator]
            consumer_group="someone-else", topic="orders-1", ack_receipt_handles=["h"])))
