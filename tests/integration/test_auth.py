"""Authentication and ACLs on a real cluster (name server, a shard of two replicas, checker)
with auth on:
every unauthorized action of the census is tried anonymously, with an unknown token and as
a known principal without the right, and each is refused with UNAUTHENTICATED or
PERMISSION_DENIED and changes nothing (the state is read back afterwards); the credential
file is reloaded while the services run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Iterator

import grpc
import pytest

import txmq
from services.common.auth import hash_token
from services.broker.transport import Refused
from tests.support.cluster import Cluster
from tests.support.replstream import open_session, replication_address
from tests.support.waiting import wait_until
from txmq.v1 import (admin_pb2, admin_pb2_grpc, broker_pb2, broker_pb2_grpc, checker_pb2, checker_pb2_grpc,
                     common_pb2, nameserver_pb2, nameserver_pb2_grpc, replication_pb2, replication_pb2_grpc)

TOKENS = {name: f"token-of-{name}-0123456789abcdef" for name in
          ("nameserver", "broker", "checker", "operator", "orders", "mallory", "tenant")}
RPC_TIMEOUT = 5.0
UNKNOWN, COMMIT = txmq.LocalTransactionState.UNKNOWN, txmq.LocalTransactionState.COMMIT


def credentials(tokens: dict[str, str] = TOKENS, extra_rules: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    services = ("nameserver", "broker", "checker")
    return {
        "principals": {name: {"service": name in services, "tokens": [hash_token(token)]}
                       for name, token in tokens.items()},
        "acl": [
            {"principal": "operator", "resource": "cluster", "actions": ["admin-read", "admin-write", "subscribe"]},
            {"principal": "orders", "resource": "topic:orders", "actions": ["publish", "subscribe"]},
            {"principal": "orders", "resource": "producer_group:orders", "actions": ["check"]},
            {"principal": "orders", "resource": "consumer_group:orders-*", "actions": ["subscribe"]},
            {"principal": "mallory", "resource": "topic:mallory-*", "actions": ["publish", "subscribe", "admin-write"]},
            {"principal": "mallory", "resource": "producer_group:mallory", "actions": ["check", "admin-read"]},
            {"principal": "mallory", "resource": "consumer_group:mallory", "actions": ["subscribe"]},
            # An operator of its own consumer groups alone (test_an_offset_reset_needs_a_right_on_the_topic).
            {"principal": "mallory", "resource": "consumer_group:mallory-ops", "actions": ["admin-write"]},
            # Everything of one namespace, nothing else (test_namespaced_rules_stop_at_their_namespace).
            {"principal": "tenant", "namespace": "teamA", "resource": "cluster",
             "actions": ["publish", "subscribe", "check"]},
            *(extra_rules or []),
        ],
    }


class Always(txmq.TransactionListener):
    """Ends every transaction, and answers every check, with ``state``."""

    def __init__(self, state: txmq.LocalTransactionState) -> None:
        self.state = state

    def execute_local_transaction(self, message: Any, arg: Any) -> Any:
        return self.state

    def check_local_transaction(self, message: Any) -> Any:
        return self.state


def write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)  # as a Secret update swaps the file: never half written


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, Path]]:
    workdir = tmp_path_factory.mktemp("auth")
    creds = workdir / "credentials.json"
    write_json(creds, credentials())
    env: dict[str, dict[str, str]] = {}
    for service in ("nameserver", "broker", "checker"):
        token_file = workdir / f"{service}.token"
        token_file.write_text(TOKENS[service] + "\n")
        env[service] = {"TXMQ_AUTH_FILES": str(creds), "TXMQ_AUTH_TOKEN_FILE": str(token_file),
                        "TXMQ_AUTH_RELOAD_SECONDS": "0.1"}
    cluster = Cluster(workdir, nameserver_env={**env["nameserver"], "TXMQ_AUTO_CREATE_TOPICS": "false"},
                      broker_env=env["broker"], checker=True,
                      checker_env={**env["checker"], "TXMQ_BROKER_REFRESH_SECONDS": "0.5"},
                      token=TOKENS["operator"], replication_factor=2, min_insync_replicas=2)
    try:
        cluster.wait_leaders()  # the replicas replicate as the broker's service identity
        cluster.create_topic("orders", queue_count=2)
        yield cluster, creds
    finally:
        cluster.stop()


def bearer(who: str | None) -> list[tuple[str, str]]:
    if who is None:
        return []
    token = TOKENS.get(who, "a-token-nobody-has")
    return [("authorization", f"Bearer {token}")]


class Census:
    """Tries an action and counts: refused with UNAUTHENTICATED / PERMISSION_DENIED, or not."""

    def __init__(self) -> None:
        self.tried = 0
        self.succeeded: list[str] = []

    def attempt(self, what: str, who: str | None, call: Callable[[list[tuple[str, str]]], Any]) -> None:
        self.tried += 1
        expected = grpc.StatusCode.UNAUTHENTICATED if who not in TOKENS else grpc.StatusCode.PERMISSION_DENIED
        try:
            call(bearer(who))
        except grpc.RpcError as exc:
            if exc.code() != expected:
                self.succeeded.append(f"{what} as {who}: {exc.code().name} {exc.details()}")
            else:
                assert exc.details(), f"{what}: a refusal must say what is missing"
            return
        except txmq.TxmqError as err:
            if err.code != expected:
                self.succeeded.append(f"{what} as {who}: {err!r}")
            return
        except Refused as refused:  # the replication port's refusal
            if refused.code != expected:
                self.succeeded.append(f"{what} as {who}: {refused}")
            else:
                assert refused.message, f"{what}: a refusal must say what is missing"
            return
        self.succeeded.append(f"{what} as {who}: succeeded")


def stream_refusal(responses: Any) -> None:
    for _ in responses:
        pass


def test_census_of_unauthorized_actions(secured: tuple[Cluster, Path], capsys: pytest.CaptureFixture[str]) -> None:
    cluster, _creds = secured
    ns_address = cluster.nameserver_address
    leader = cluster.leader("broker-0")
    assert leader is not None
    broker_address = leader.address
    channel = grpc.insecure_channel(ns_address)
    broker_channel = grpc.insecure_channel(broker_address)
    checker_channel = grpc.insecure_channel(cluster.checkers[0].address)
    ns = nameserver_pb2_grpc.NameServerServiceStub(channel)
    admin = admin_pb2_grpc.AdminServiceStub(channel)
    broker = broker_pb2_grpc.BrokerServiceStub(broker_channel)
    checker = checker_pb2_grpc.CheckerServiceStub(checker_channel)
    replication = replication_pb2_grpc.ReplicationServiceStub(broker_channel)
    # The leader's own epoch: a hello the session check would accept, refused only for who sends it.
    leader_epoch = {b.name: b for b in cluster.list_brokers(ns_address)}["broker-0"].leader_epoch
    operator = bearer("operator")
    orders = bearer("orders")

    # The state the census must leave as it is: a pending transaction of group "orders",
    # a committed message, one delivery of it in flight for consumer group "orders-a".
    with txmq.TransactionProducer(ns_address, producer_group="orders", listener=Always(UNKNOWN), answer_checks=False,
                                  token=TOKENS["orders"]) as producer:
        pending = producer.send_in_transaction(txmq.Message("orders", b"pending"))
    with txmq.Producer(ns_address, token=TOKENS["orders"]) as plain:
        plain.send(txmq.Message("orders", b"visible"))
    with txmq.SimpleConsumer(ns_address, consumer_group="orders-a", subscriptions={"orders": "*"},
                             await_duration_seconds=1.0, token=TOKENS["orders"]) as consumer:
        received = wait_until(lambda: consumer.receive(max_messages=1, invisible_duration_seconds=60.0), 15.0,
                              message="the orders consumer received nothing")
    handle = received[0].receipt_handle
    brokers_before = [(b.name, b.address) for b in cluster.list_brokers()]
    checkers_before = [c.name for c in ns.ListCheckers(nameserver_pb2.ListCheckersRequest(), metadata=operator,
                                                       timeout=RPC_TIMEOUT).checkers]
    topics_before = {t.topic for t in admin.ListTopics(admin_pb2.ListTopicsRequest(), metadata=operator,
                                                       timeout=RPC_TIMEOUT).topics}
    offsets_before = broker.GetQueueOffsets(broker_pb2.GetQueueOffsetsRequest(topic="orders"),
                                            metadata=orders, timeout=RPC_TIMEOUT)

    census = Census()
    half = txmq.Message("orders", b"forged")
    for who in (None, "stranger", "mallory"):
        census.attempt("register a broker", who, lambda md: ns.RegisterBroker(nameserver_pb2.RegisterBrokerRequest(
            broker=nameserver_pb2.BrokerInfo(name="broker-0", address="10.9.9.9:10911")), metadata=md, timeout=RPC_TIMEOUT))
        census.attempt("unregister a broker", who, lambda md: ns.UnregisterBroker(
            nameserver_pb2.UnregisterBrokerRequest(name="broker-0"), metadata=md, timeout=RPC_TIMEOUT))
        census.attempt("register a checker", who, lambda md: ns.RegisterChecker(nameserver_pb2.RegisterCheckerRequest(
            checker=nameserver_pb2.CheckerInfo(name="rogue", address="10.9.9.9:10921")), metadata=md, timeout=RPC_TIMEOUT))
        census.attempt("create a topic", who, lambda md: admin.CreateTopic(
            admin_pb2.CreateTopicRequest(topic="stolen", queue_count=1), metadata=md, timeout=RPC_TIMEOUT))
        census.attempt("send without publish", who, lambda md: broker.SendMessage(broker_pb2.SendMessageRequest(
            message=common_pb2.Message(topic="orders", body=b"x", type=common_pb2.MESSAGE_TYPE_NORMAL)),
            metadata=md, timeout=RPC_TIMEOUT))
        census.attempt("send on the Produce stream without publish", who, lambda md: stream_refusal(broker.Produce(
            iter([broker_pb2.ProduceRequest(entries=[broker_pb2.ProduceEntry(request_id=1, send_message=(
                broker_pb2.SendMessageRequest(message=common_pb2.Message(
                    topic="orders", body=b"x", type=common_pb2.MESSAGE_TYPE_NORMAL))))])]),
            metadata=md, timeout=RPC_TIMEOUT)))
        census.attempt("receive as another group", who, lambda md: broker.ReceiveMessages(
            broker_pb2.ReceiveMessagesRequest(consumer_group="orders-a", topic="orders", queue_id=-1, max_messages=8,
                                              invisible_duration_seconds=30.0), metadata=md, timeout=RPC_TIMEOUT))
        census.attempt("ack someone else's receipt handle", who, lambda md: broker.AckMessages(
            broker_pb2.AckMessagesRequest(consumer_group="orders-a", topic="orders", receipt_handles=[handle]),
            metadata=md, timeout=RPC_TIMEOUT))
        census.attempt("ack it on a receive as its group", who, lambda md: broker.ReceiveMessages(
            broker_pb2.ReceiveMessagesRequest(consumer_group="orders-a", topic="orders", queue_id=-1, max_messages=1,
                                              invisible_duration_seconds=30.0, ack_receipt_handles=[handle]),
            metadata=md, timeout=RPC_TIMEOUT))
        census.attempt("ack it on a receive of one's own group", who, lambda md: broker.ReceiveMessages(
            broker_pb2.ReceiveMessagesRequest(consumer_group="mallory", topic="orders", queue_id=-1, max_messages=1,
                                              invisible_duration_seconds=30.0, ack_receipt_handles=[handle]),
            metadata=md, timeout=RPC_TIMEOUT))
        census.attempt("ack it under one's own group", who, lambda md: broker.AckMessages(
            broker_pb2.AckMessagesRequest(consumer_group="mallory", topic="orders", receipt_handles=[handle]),
            metadata=md, timeout=RPC_TIMEOUT))
        census.attempt("subscribe to another group's checks", who, lambda md: stream_refusal(
            checker.CheckTransactionState(iter([checker_pb2.CheckTransactionStateRequest(
                subscribe=checker_pb2.Subscribe(producer_groups=["orders"], client_id="rogue", check_credit=4))]),
                metadata=md, timeout=RPC_TIMEOUT)))
        if who == "mallory":  # a stream only a known principal can open, then an answer for another group
            census.attempt("answer another group's check", who, lambda md: stream_refusal(
                checker.CheckTransactionState(iter([
                    checker_pb2.CheckTransactionStateRequest(subscribe=checker_pb2.Subscribe(
                        producer_groups=["mallory"], client_id="rogue", check_credit=4)),
                    checker_pb2.CheckTransactionStateRequest(answer=checker_pb2.CheckAnswer(
                        check_id="forged", result=common_pb2.CHECK_RESULT_COMMIT,
                        transaction_id=pending.transaction_id, producer_group="orders"))]),
                    metadata=md, timeout=RPC_TIMEOUT)))
        census.attempt("resolve another group's transaction", who, lambda md: broker.EndTransaction(
            broker_pb2.EndTransactionRequest(transaction_id=pending.transaction_id, producer_group="orders",
                                             resolution=common_pb2.TRANSACTION_RESOLUTION_COMMIT,
                                             source=common_pb2.TRANSACTION_SOURCE_CLIENT),
            metadata=md, timeout=RPC_TIMEOUT))
        census.attempt("resolve it naming no group", who, lambda md: broker.EndTransaction(
            broker_pb2.EndTransactionRequest(transaction_id=pending.transaction_id,
                                             resolution=common_pb2.TRANSACTION_RESOLUTION_COMMIT,
                                             source=common_pb2.TRANSACTION_SOURCE_CLIENT),
            metadata=md, timeout=RPC_TIMEOUT))
        census.attempt("resolve it as an operator at the broker", who, lambda md: broker.EndTransaction(
            broker_pb2.EndTransactionRequest(transaction_id=pending.transaction_id, operator="mallory",
                                             resolution=common_pb2.TRANSACTION_RESOLUTION_COMMIT,
                                             source=common_pb2.TRANSACTION_SOURCE_OPERATOR, reason="x"),
            metadata=md, timeout=RPC_TIMEOUT))
        census.attempt("resolve it through the admin API", who, lambda md: admin.ResolveTransaction(
            admin_pb2.ResolveTransactionRequest(transaction_id=pending.transaction_id, operator="mallory",
                                                resolution=common_pb2.TRANSACTION_RESOLUTION_COMMIT, reason="x"),
            metadata=md, timeout=RPC_TIMEOUT))
        census.attempt("claim another group's checks", who, lambda md: broker.ClaimChecks(
            broker_pb2.ClaimChecksRequest(producer_groups=["orders"], max_checks=10, lease_seconds=30.0,
                                          checker_id="rogue"), metadata=md, timeout=RPC_TIMEOUT))
        census.attempt("list transactions without admin-read", who, lambda md: admin.ListTransactions(
            admin_pb2.ListTransactionsRequest(), metadata=md, timeout=RPC_TIMEOUT))
        census.attempt("list another group's transactions", who, lambda md: admin.ListTransactions(
            admin_pb2.ListTransactionsRequest(producer_group="orders"), metadata=md, timeout=RPC_TIMEOUT))
        census.attempt("query a broker's transactions", who, lambda md: broker.QueryTransactions(
            broker_pb2.QueryTransactionsRequest(producer_group="orders", limit=10), metadata=md, timeout=RPC_TIMEOUT))
        census.attempt("describe a transaction", who, lambda md: admin.DescribeTransaction(
            admin_pb2.DescribeTransactionRequest(transaction_id=pending.transaction_id), metadata=md,
            timeout=RPC_TIMEOUT))
        census.attempt("open a replication stream", who, lambda md: open_session(
            replication_address(leader), "broker-0", 1, leader_epoch,
            token=md[0][1].removeprefix("Bearer ") if md else ""))
        census.attempt("fetch a checkpoint", who, lambda md: stream_refusal(replication.FetchCheckpoint(
            replication_pb2.FetchCheckpointRequest(shard="broker-0", replica_id=1), metadata=md, timeout=RPC_TIMEOUT)))
    # The SDK as the wrong principal: its errors are the same, as TxmqError subclasses.
    with txmq.Producer(ns_address, token=TOKENS["mallory"], max_attempts=1) as forged:
        census.attempt("send with the SDK without publish", "mallory", lambda md: forged.send(half))

    with capsys.disabled():
        print(f"\n{census.tried} unauthorized actions tried, {len(census.succeeded)} succeeded")
    assert census.succeeded == [], "\n".join(census.succeeded)

    # Nothing changed.
    assert [(b.name, b.address) for b in cluster.list_brokers()] == brokers_before
    assert [c.name for c in ns.ListCheckers(nameserver_pb2.ListCheckersRequest(), metadata=operator,
                                            timeout=RPC_TIMEOUT).checkers] == checkers_before
    assert {t.topic for t in admin.ListTopics(admin_pb2.ListTopicsRequest(), metadata=operator,
                                              timeout=RPC_TIMEOUT).topics} == topics_before
    assert broker.GetQueueOffsets(broker_pb2.GetQueueOffsetsRequest(topic="orders"), metadata=orders,
                                  timeout=RPC_TIMEOUT) == offsets_before
    row = admin.DescribeTransaction(admin_pb2.DescribeTransactionRequest(transaction_id=pending.transaction_id),
                                    metadata=operator, timeout=RPC_TIMEOUT).transaction
    assert row.state == common_pb2.TRANSACTION_STATE_PREPARED
    # The delivery is still in flight (not acknowledged by anyone else): its owner can act on it.
    broker.ChangeInvisibleDuration(broker_pb2.ChangeInvisibleDurationRequest(
        consumer_group="orders-a", topic="orders", receipt_handle=handle, invisible_duration_seconds=1.0),
        metadata=orders, timeout=RPC_TIMEOUT)

    # And the principal who may do these things can: the operator resolves, and is on record.
    resolved = admin.ResolveTransaction(admin_pb2.ResolveTransactionRequest(
        transaction_id=pending.transaction_id, operator="someone-else", reason="census done",
        resolution=common_pb2.TRANSACTION_RESOLUTION_ROLLBACK), metadata=operator, timeout=RPC_TIMEOUT).transaction
    assert resolved.state == common_pb2.TRANSACTION_STATE_ROLLED_BACK
    assert resolved.operator == "operator"
    for c in (channel, broker_channel, checker_channel):
        c.close()


def test_a_stream_refused_mid_way_always_hears_permission_denied(secured: tuple[Cluster, Path]) -> None:
    """A message refused after a stream has begun ends it with PERMISSION_DENIED every
    time, even when the refusal comes while the service writes on the stream. Cancelling
    that write half-way left its operation on the call, the refusal's status could not be
    sent, and the caller heard nothing until its deadline: before the fix, 9 produce
    streams in 10 and 1 check stream in 30 or so (CI saw it in the census)."""
    cluster, _creds = secured
    leader = cluster.leader("broker-0")
    assert leader is not None
    checker = checker_pb2_grpc.CheckerServiceStub(grpc.insecure_channel(cluster.checkers[0].address))
    broker = broker_pb2_grpc.BrokerServiceStub(grpc.insecure_channel(leader.address))

    def answer_for_another_group() -> Any:
        return checker.CheckTransactionState(iter([
            checker_pb2.CheckTransactionStateRequest(subscribe=checker_pb2.Subscribe(
                producer_groups=["mallory"], client_id="rogue", check_credit=4)),
            checker_pb2.CheckTransactionStateRequest(answer=checker_pb2.CheckAnswer(
                check_id="forged", result=common_pb2.CHECK_RESULT_COMMIT, transaction_id="forged",
                broker_name="broker-0", producer_group="orders"))]), metadata=bearer("mallory"), timeout=2.0)

    def send_then_send_where_not_allowed() -> Any:
        def entry(request_id: int, topic: str) -> broker_pb2.ProduceRequest:
            return broker_pb2.ProduceRequest(entries=[broker_pb2.ProduceEntry(
                request_id=request_id, send_message=broker_pb2.SendMessageRequest(message=common_pb2.Message(
                    topic=topic, body=b"x", type=common_pb2.MESSAGE_TYPE_NORMAL)))])
        return broker.Produce(iter([entry(1, "mallory-absent"), entry(2, "orders")]),
                              metadata=bearer("mallory"), timeout=2.0)

    outcomes: dict[str, dict[str, int]] = {}
    for name, call, times in (("check answer", answer_for_another_group, 60),
                              ("produce", send_then_send_where_not_allowed, 20)):
        seen = outcomes.setdefault(name, {})
        for _ in range(times):
            try:
                stream_refusal(call())
                code = "OK"
            except grpc.RpcError as exc:
                code = exc.code().name
            seen[code] = seen.get(code, 0) + 1
    assert outcomes == {"check answer": {"PERMISSION_DENIED": 60}, "produce": {"PERMISSION_DENIED": 20}}


def test_the_replication_port_lets_a_service_identity_past_authentication(secured: tuple[Cluster, Path]) -> None:
    """The census shows who is refused; this shows the broker's own token gets past the
    check to the session's (a replica id that is no replica: INVALID_ARGUMENT)."""
    cluster, _creds = secured
    leader = cluster.leader("broker-0")
    assert leader is not None
    with pytest.raises(Refused) as refused:
        open_session(replication_address(leader), "broker-0", 7, 0, token=TOKENS["broker"])
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT, refused.value
    assert "replica_id 7" in refused.value.message


def test_sdk_flows_with_the_right_credentials(secured: tuple[Cluster, Path]) -> None:
    """A transactional producer with its token: the broker's check reaches it through the
    checker (which calls the broker as its own service identity) and commits."""
    cluster, _creds = secured

    class CommitOnCheck(txmq.TransactionListener):
        def execute_local_transaction(self, message: Any, arg: Any) -> Any:
            return txmq.LocalTransactionState.UNKNOWN

        def check_local_transaction(self, message: Any) -> Any:
            return txmq.LocalTransactionState.COMMIT

    with txmq.TransactionProducer(cluster.nameserver_address, producer_group="orders", listener=CommitOnCheck(),
                                  token=TOKENS["orders"]) as producer:
        result = producer.send_in_transaction(txmq.Message("orders", b"checked"))
        admin = cluster.admin_stub()

        def committed() -> bool:
            row = admin.DescribeTransaction(admin_pb2.DescribeTransactionRequest(
                transaction_id=result.transaction_id), timeout=RPC_TIMEOUT).transaction
            return row.state == common_pb2.TRANSACTION_STATE_COMMITTED
        wait_until(committed, 30.0, message="the check never committed the transaction")


def test_the_asyncio_sdk_carries_its_token(secured: tuple[Cluster, Path]) -> None:
    """txmq.aio with the group's token: the half message, the check over the asyncio check
    stream and the commit all pass the ACL; without a token the send is refused."""
    import asyncio

    from txmq.aio import AsyncProducer, AsyncTransactionListener, AsyncTransactionProducer

    cluster, _creds = secured

    class CommitOnCheck(AsyncTransactionListener):
        async def execute_local_transaction(self, message: Any, arg: Any) -> Any:
            return txmq.LocalTransactionState.UNKNOWN

        async def check_local_transaction(self, message: Any) -> Any:
            return txmq.LocalTransactionState.COMMIT

    admin = cluster.admin_stub()

    def state(transaction_id: str) -> int:
        return admin.DescribeTransaction(admin_pb2.DescribeTransactionRequest(
            transaction_id=transaction_id), timeout=RPC_TIMEOUT).transaction.state

    async def main() -> None:
        async with AsyncProducer(cluster.nameserver_address) as anonymous:
            with pytest.raises(txmq.UnauthenticatedError):
                await anonymous.send(txmq.Message("orders", b"anonymous"))
        async with AsyncTransactionProducer(cluster.nameserver_address, producer_group="orders",
                                            listener=CommitOnCheck(), token=TOKENS["orders"]) as producer:
            result = await producer.send_in_transaction(txmq.Message("orders", b"checked-async"))
            deadline = asyncio.get_running_loop().time() + 30
            while state(result.transaction_id) != common_pb2.TRANSACTION_STATE_COMMITTED:
                assert asyncio.get_running_loop().time() < deadline, "the async check never committed it"
                await asyncio.sleep(0.1)

    asyncio.run(main())


def test_credential_file_is_reloaded(secured: tuple[Cluster, Path]) -> None:
    """A token added, a token revoked and a rule granted take effect without a restart; a
    broken file leaves the previous one in force."""
    cluster, creds = secured
    admin = admin_pb2_grpc.AdminServiceStub(grpc.insecure_channel(cluster.nameserver_address))
    request = admin_pb2.ListTransactionsRequest(producer_group="orders")

    def outcome(token: str) -> grpc.StatusCode:
        try:
            admin.ListTransactions(request, metadata=[("authorization", f"Bearer {token}")], timeout=RPC_TIMEOUT)
        except grpc.RpcError as exc:
            return exc.code()
        return grpc.StatusCode.OK

    assert outcome("a-rotated-token-0123456789") == grpc.StatusCode.UNAUTHENTICATED
    assert outcome(TOKENS["mallory"]) == grpc.StatusCode.PERMISSION_DENIED
    # Rotation: mallory gets a second token, then the first one is revoked; a rule is added.
    rotated = {**TOKENS, "mallory": "a-rotated-token-0123456789"}
    both = credentials()
    both["principals"]["mallory"]["tokens"].append(hash_token(rotated["mallory"]))
    write_json(creds, both)
    wait_until(lambda: outcome(rotated["mallory"]) == grpc.StatusCode.PERMISSION_DENIED, 10.0,
               message="the added token was not picked up")
    assert outcome(TOKENS["mallory"]) == grpc.StatusCode.PERMISSION_DENIED  # the old one still works meanwhile
    write_json(creds, credentials(rotated, extra_rules=[
        {"principal": "mallory", "resource": "producer_group:orders", "actions": ["admin-read"]}]))
    wait_until(lambda: outcome(rotated["mallory"]) == grpc.StatusCode.OK, 10.0, message="the new rule was not applied")
    assert outcome(TOKENS["mallory"]) == grpc.StatusCode.UNAUTHENTICATED
    # A broken file: refused, the previous credentials stay in force.
    creds.write_text("principals: [this is not: valid")
    wait_until(lambda: "credential files not reloaded" in cluster.nameservers[0].log_text(), 10.0,
               message="the broken file was not noticed")
    assert outcome(rotated["mallory"]) == grpc.StatusCode.OK
    write_json(creds, credentials())
    wait_until(lambda: outcome(TOKENS["mallory"]) == grpc.StatusCode.PERMISSION_DENIED, 10.0,
               message="the restored file was not picked up")


def test_the_spark_connector_sends_the_token_from_its_environment(secured: tuple[Cluster, Path],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The connector's client (driver and executors) authenticates with ``$TXMQ_TOKEN``."""
    from txmq_pipeline import _broker

    cluster, _creds = secured
    request = broker_pb2.GetQueueOffsetsRequest(topic="orders")
    address = cluster.leader("broker-0").address
    monkeypatch.delenv("TXMQ_TOKEN", raising=False)
    anonymous = _broker.connect(cluster.nameserver_address)
    with pytest.raises(txmq.UnauthenticatedError):
        anonymous.call(anonymous.broker(address).GetQueueOffsets, request)
    anonymous.close()
    monkeypatch.setenv("TXMQ_TOKEN", TOKENS["orders"])
    client = _broker.connect(cluster.nameserver_address)
    try:
        assert client.call(client.broker(address).GetQueueOffsets, request).topic == "orders"
    finally:
        client.close()


def test_cli_token_and_the_operator_on_record(secured: tuple[Cluster, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """``txmq --token`` (or ``$TXMQ_TOKEN``): a principal without admin-write is refused; with
    it, the resolution records the token's principal, not the free-text --operator."""
    import io

    from txmq._cli import main

    cluster, _creds = secured

    with txmq.TransactionProducer(cluster.nameserver_address, producer_group="orders", listener=Always(UNKNOWN),
                                  answer_checks=False, token=TOKENS["orders"]) as producer:
        pending = producer.send_in_transaction(txmq.Message("orders", b"for the operator"))

    def txmq_cli(*argv: str) -> tuple[int, str]:
        out, err = io.StringIO(), io.StringIO()
        code = main(["--nameserver", cluster.nameserver_address, "--json", *argv], stdout=out, stderr=err)
        return code, out.getvalue() + err.getvalue()

    resolve = ("txn", "resolve", pending.transaction_id, "--commit", "--operator", "alice", "--reason", "cli test")
    monkeypatch.delenv("TXMQ_TOKEN", raising=False)
    code, text = txmq_cli(*resolve)
    assert code == 1 and "credentials required" in text
    code, text = txmq_cli("--token", TOKENS["mallory"], *resolve)
    assert code == 1 and "'mallory' may not admin-write cluster" in text
    monkeypatch.setenv("TXMQ_TOKEN", TOKENS["operator"])
    code, text = txmq_cli(*resolve)
    assert code == 0, text
    assert json.loads(text)["operator"] == "operator"


def test_namespaced_rules_stop_at_their_namespace(secured: tuple[Cluster, Path]) -> None:
    """A principal whose rules are scoped to namespace teamA sends, commits and receives
    there; the same calls in teamB, on a topic and groups of the same names, are refused
    with PermissionDeniedError and leave teamB's topic empty."""
    cluster, _creds = secured
    address, token = cluster.nameserver_address, TOKENS["tenant"]
    for ns in ("teamA", "teamB"):
        cluster.create_topic(f"{ns}%events", queue_count=1)

    with txmq.TransactionProducer(address, producer_group="tx", listener=Always(COMMIT), token=token,
                                  namespace="teamA") as producer:
        assert producer.send_in_transaction(txmq.Message("events", b"a")).state == txmq.TransactionState.COMMITTED
    with txmq.SimpleConsumer(address, consumer_group="reader", subscriptions={"events": "*"}, token=token,
                             namespace="teamA", await_duration_seconds=0.5) as consumer:
        got = wait_until(lambda: consumer.receive(max_messages=4), 15.0, message="teamA's message")
        assert [m.body for m in got] == [b"a"]

    with txmq.Producer(address, token=token, namespace="teamB") as plain:
        with pytest.raises(txmq.PermissionDeniedError, match="teamB%events"):
            plain.send(txmq.Message("events", b"b"))
    with txmq.TransactionProducer(address, producer_group="tx", listener=Always(COMMIT), token=token,
                                  namespace="teamB", answer_checks=False) as producer:
        with pytest.raises(txmq.PermissionDeniedError):
            producer.send_in_transaction(txmq.Message("events", b"b-txn"))
    with txmq.SimpleConsumer(address, consumer_group="reader", subscriptions={"events": "*"}, token=token,
                             namespace="teamB", await_duration_seconds=0.5) as consumer:
        with pytest.raises(txmq.PermissionDeniedError, match="teamB"):
            consumer.receive(max_messages=4)
    described = cluster.admin_stub().DescribeTopic(admin_pb2.DescribeTopicRequest(topic="teamB%events"),
                                                   timeout=RPC_TIMEOUT)
    assert [q.max_offset for q in described.queues] == [0]


def test_an_offset_reset_records_the_callers_principal(secured: tuple[Cluster, Path]) -> None:
    """Issue 32: a reset is admin-write on the consumer group; with auth on the principal
    the token authenticates is recorded (group describe shows it), not the --operator text."""
    cluster, _creds = secured
    with txmq.Admin(cluster.nameserver_address, token=TOKENS["mallory"]) as admin:
        with pytest.raises(txmq.PermissionDeniedError):
            admin.reset_offsets("audited", "orders", to_latest=True, dry_run=False, operator="mallory")
    with txmq.Admin(cluster.nameserver_address, token=TOKENS["operator"]) as admin:
        done = admin.reset_offsets("audited", "orders", to_latest=True, dry_run=False, operator="not-me",
                                   reason="auth test")
        assert done.applied and done.operator == "operator"
        status = admin.consumer_groups("audited", topic="orders").queues
        assert status and {q.last_reset_operator for q in status} == {"operator"}


def test_an_offset_reset_needs_a_right_on_the_topic(secured: tuple[Cluster, Path]) -> None:
    """admin-write on a consumer group is not a right on every topic: a reset of the group in
    a topic the caller holds no right on is refused naming the topic (it would read that
    topic's offsets and tell whether it exists) and changes nothing; one in its own topic
    goes on."""
    cluster, _creds = secured
    cluster.create_topic("mallory-reset", queue_count=1)
    with txmq.Admin(cluster.nameserver_address, token=TOKENS["mallory"]) as admin:
        for dry_run in (True, False):
            with pytest.raises(txmq.PermissionDeniedError) as refused:
                admin.reset_offsets("mallory-ops", "orders", to_earliest=True, dry_run=dry_run, operator="mallory")
            assert "topic 'orders'" in str(refused.value)
        with pytest.raises(txmq.PermissionDeniedError):  # the same for a topic that does not exist
            admin.reset_offsets("mallory-ops", "no-such-topic", to_earliest=True, dry_run=True)
        planned = admin.reset_offsets("mallory-ops", "mallory-reset", to_earliest=True, dry_run=True)
        assert not planned.applied and planned.queues
    with txmq.Admin(cluster.nameserver_address, token=TOKENS["operator"]) as admin:
        assert not [q for q in admin.consumer_groups(topic="orders").queues if q.consumer_group == "mallory-ops"]
