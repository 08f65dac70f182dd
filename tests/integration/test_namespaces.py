"""Namespaces end to end: two namespaces each hold a topic ``orders`` and groups of the
same names, and nothing crosses between them — sends, receives, checks, transactions,
dead letters, the admin listings and the CLI. A name cannot smuggle a namespace, on the
client or on the wire.

One module cluster: a name server, a broker and a checker, first check 0.5 s after a half
message, two deliveries before a message is dead-lettered.
"""

from __future__ import annotations

import asyncio
import io
import json
import threading
from typing import Iterator

import grpc
import pytest

import txmq
from txmq.aio import AsyncProducer, AsyncSimpleConsumer, AsyncTransactionListener, AsyncTransactionProducer
from txmq.errors import ConsumerGroupNotFoundError, InvalidNameError
from txmq.v1 import broker_pb2, broker_pb2_grpc, common_pb2
from tests.support import presets
from tests.support.cluster import Cluster
from tests.support.waiting import wait_until

LocalState = txmq.LocalTransactionState
NAMESPACES = ("blue", "green")


@pytest.fixture(scope="module")
def ns_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("namespaces"), checker=True,
                broker_env=presets.NAMESPACES_BROKER, checker_env=presets.CHECKER)
    try:
        for ns in NAMESPACES:
            with txmq.Admin(c.nameserver_address, namespace=ns) as admin:
                admin.create_topic("orders", queue_count=2)
            c.wait_route(f"{ns}%orders", 2, 15)
        yield c
    finally:
        c.stop()


class Checked(txmq.TransactionListener):
    """Leaves every transaction UNKNOWN; answers checks with ``answer`` and records them."""

    def __init__(self, answer: LocalState) -> None:
        self.answer = answer
        self.checked: list[txmq.TransactionMessage] = []
        self.lock = threading.Lock()

    def execute_local_transaction(self, message: txmq.TransactionMessage, arg: object) -> LocalState:
        return LocalState.UNKNOWN

    def check_local_transaction(self, message: txmq.TransactionMessage) -> LocalState:
        with self.lock:
            self.checked.append(message)
        return self.answer


def receive_all(c: txmq.SimpleConsumer, expected: int, timeout: float = 20.0) -> list[txmq.ReceivedMessage]:
    got: list[txmq.ReceivedMessage] = []

    def step() -> bool:
        for m in c.receive(max_messages=32, invisible_duration_seconds=30.0):
            got.append(m)
            c.ack(m)
        return len(got) >= expected
    wait_until(step, timeout, interval=0.0, message=f"{expected} message(s) for {c.consumer_group}")
    return got


def test_same_names_in_two_namespaces_never_cross(ns_cluster: Cluster) -> None:
    address = ns_cluster.nameserver_address
    listeners = {"blue": Checked(LocalState.COMMIT), "green": Checked(LocalState.ROLLBACK)}
    for ns in NAMESPACES:
        with txmq.Producer(address, namespace=ns) as p:
            p.send(txmq.Message("orders", f"{ns}-plain".encode()))
    producers = [txmq.TransactionProducer(address, producer_group="orders-tx", listener=listeners[ns],
                                          namespace=ns, checker_refresh_seconds=0.5) for ns in NAMESPACES]
    try:
        for ns, p in zip(NAMESPACES, producers):
            result = p.send_in_transaction(txmq.Message("orders", f"{ns}-txn".encode()))
            assert result.state == txmq.TransactionState.PREPARED
        # Each group's checks reach its own namespace's producer only, which decides them.
        wait_until(lambda: all(listeners[ns].checked for ns in NAMESPACES), 20, message="a check per namespace")
    finally:
        for p in producers:
            p.close()
    for ns in NAMESPACES:
        assert {m.body for m in listeners[ns].checked} == {f"{ns}-txn".encode()}
        assert {m.topic for m in listeners[ns].checked} == {f"{ns}%orders"}

    # The same consumer group name in each namespace: each sees its own topic alone, and
    # the rolled-back transaction of green never.
    consumers = {ns: txmq.SimpleConsumer(address, consumer_group="billing", subscriptions={"orders": "*"},
                                         namespace=ns, await_duration_seconds=0.5) for ns in NAMESPACES}
    try:
        blue = receive_all(consumers["blue"], 2)
        assert sorted(m.body for m in blue) == [b"blue-plain", b"blue-txn"]
        assert {m.topic for m in blue} == {"blue%orders"} and blue[0].consumer_group == "blue%billing"
        green = receive_all(consumers["green"], 1)
        assert [m.body for m in green] == [b"green-plain"]
        assert consumers["green"].receive(max_messages=32) == []
        assert consumers["blue"].receive(max_messages=32) == []
    finally:
        for c in consumers.values():
            c.close()

    # Listings: a namespaced admin sees its own topic, by its short name; the cluster-wide
    # one sees both.
    for ns in NAMESPACES:
        with txmq.Admin(address, namespace=ns) as admin:
            assert [t.topic for t in admin.list_topics().topics] == ["orders"]
            described = admin.describe_topic("orders")
            assert described.topic == f"{ns}%orders"
            groups = {q.consumer_group for q in admin.consumer_groups(topic="orders").queues}
            assert groups == {f"{ns}%billing"}
            every_group = {q.consumer_group for q in admin.consumer_groups().queues}
            assert f"{ns}%billing" in every_group and all(g.startswith(f"{ns}%") for g in every_group)
            groups_of_txns = {t.producer_group for t in admin.list_transactions().transactions}
            assert f"{ns}%orders-tx" in groups_of_txns and all(g.startswith(f"{ns}%") for g in groups_of_txns)
    with txmq.Admin(address) as admin:
        assert {"blue%orders", "green%orders"} <= {t.topic for t in admin.list_topics().topics}


def test_dead_letters_stay_in_their_namespace(ns_cluster: Cluster) -> None:
    address = ns_cluster.nameserver_address
    with txmq.Admin(address, namespace="blue") as admin:
        admin.create_topic("poison", queue_count=1)
    ns_cluster.wait_route("blue%poison", 1, 15)
    with txmq.Producer(address, namespace="blue") as p:
        poison = p.send(txmq.Message("poison", b"poison")).message_id
    with txmq.SimpleConsumer(address, consumer_group="dlq-test", subscriptions={"poison": "*"},
                             namespace="blue", await_duration_seconds=0.5) as c:
        # Never acknowledged: after two deliveries it is the group's dead letter.
        def dead() -> bool:
            c.receive(max_messages=32, invisible_duration_seconds=0.2)
            with txmq.Admin(address, namespace="blue") as admin:
                return [m.message.message_id for m in admin.dead_letters("dlq-test").messages] == [poison]
        wait_until(dead, 20, interval=0.1, message="the poison message dead-lettered")
    with txmq.SimpleConsumer(address, consumer_group="dlq-reader", subscriptions={"%DLQ%dlq-test": "*"},
                             namespace="blue", await_duration_seconds=0.5) as c:
        got = receive_all(c, 1)
        assert got[0].body == b"poison" and got[0].topic == "%DLQ%blue%dlq-test"
    with txmq.Admin(address, namespace="green") as admin:  # green's group of that name has none
        try:
            rows = list(admin.dead_letters("dlq-test").messages)
        except ConsumerGroupNotFoundError:
            rows = []
        assert rows == []


def test_a_name_cannot_smuggle_a_namespace(ns_cluster: Cluster) -> None:
    address = ns_cluster.nameserver_address
    with txmq.Producer(address, namespace="blue") as p:
        with pytest.raises(InvalidNameError) as info:
            p.send(txmq.Message("green%orders", b"x"))
        assert info.value.field == "topic" and "green%orders" in str(info.value)
    with pytest.raises(InvalidNameError) as info:
        txmq.SimpleConsumer(address, consumer_group="g", subscriptions={"orders": "*"}, namespace="bad ns")
    assert info.value.field == "namespace"
    with pytest.raises(InvalidNameError) as info:
        txmq.SimpleConsumer(address, consumer_group="green%g", subscriptions={"orders": "*"}, namespace="blue")
    assert info.value.field == "consumer_group"
    # On the wire (a client that skips the SDK's checks): two namespaces in one name, or
    # a namespace that is not a valid one, are INVALID_ARGUMENT naming the field.
    broker = ns_cluster.brokers[0]
    with grpc.insecure_channel(broker.address) as channel:
        stub = broker_pb2_grpc.BrokerServiceStub(channel)
        for topic in ("green%blue%orders", "bl.ue%orders", "blue%"):
            with pytest.raises(grpc.RpcError) as rpc:
                stub.SendMessage(broker_pb2.SendMessageRequest(message=common_pb2.Message(
                    topic=topic, body=b"x", type=common_pb2.MESSAGE_TYPE_NORMAL)), timeout=5)
            assert rpc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "topic" in rpc.value.details()
        with pytest.raises(grpc.RpcError) as rpc:
            stub.ReceiveMessages(broker_pb2.ReceiveMessagesRequest(
                consumer_group="a%b%billing", topic="blue%orders", queue_id=-1, max_messages=1,
                invisible_duration_seconds=1), timeout=5)
        assert rpc.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "consumer_group" in rpc.value.details()


def test_the_cli_works_in_a_namespace(ns_cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """--namespace / $TXMQ_NAMESPACE: the arguments are in the namespace, and the topic,
    group and transaction listings show that namespace's alone."""
    from txmq._cli import main  # the CLI's entry point, run in process
    address = ns_cluster.nameserver_address
    for ns in NAMESPACES:  # a pending transaction of group cli-tx and a position of group cli-g in each
        with txmq.TransactionProducer(address, producer_group="cli-tx", listener=Checked(LocalState.COMMIT),
                                      namespace=ns, answer_checks=False) as p:
            p.send_in_transaction(txmq.Message("orders", b"cli-pending"))  # left UNKNOWN: pending
            p.send(txmq.Message("orders", b"cli"))
        with txmq.SimpleConsumer(address, consumer_group="cli-g", subscriptions={"orders": "*"}, namespace=ns,
                                 await_duration_seconds=0.3) as c:
            wait_until(lambda: c.receive(max_messages=1), 15, message="a delivery to cli-g")

    def listed(*args: str) -> dict:
        out = io.StringIO()
        assert main(["--nameserver", address, "--namespace", "green", "--json", *args], out) == 0
        return json.loads(out.getvalue())
    groups = {g["consumer_group"] for g in listed("group", "list")["groups"]}
    assert "green%cli-g" in groups and not [g for g in groups if not g.startswith("green%")]
    producers = {t["producer_group"] for t in listed("txn", "list")["transactions"]}
    assert "green%cli-tx" in producers and producers <= {"green%cli-tx", "green%orders-tx", "green%aio-tx"}
    out = io.StringIO()
    assert main(["--nameserver", address, "--namespace", "green", "--json", "topic", "list"], out) == 0
    assert '"topic": "orders"' in out.getvalue() and "blue" not in out.getvalue()
    monkeypatch.setenv("TXMQ_NAMESPACE", "blue")
    out = io.StringIO()
    assert main(["--nameserver", address, "topic", "describe", "orders"], out) == 0
    assert "topic blue%orders" in out.getvalue()
    err = io.StringIO()
    assert main(["--nameserver", address, "topic", "describe", "green%orders"], io.StringIO(), err) == 2
    assert "topic 'green%orders' is invalid" in err.getvalue()


def test_the_asyncio_clients_take_a_namespace(ns_cluster: Cluster) -> None:
    """AsyncTransactionProducer and AsyncSimpleConsumer of green: a committed transaction
    reaches green's group, and a blue group of the same name sees nothing of it."""
    address = ns_cluster.nameserver_address

    class Commit(AsyncTransactionListener):
        async def execute_local_transaction(self, message: txmq.TransactionMessage, arg: object) -> LocalState:
            return LocalState.COMMIT

        async def check_local_transaction(self, message: txmq.TransactionMessage) -> LocalState:
            return LocalState.COMMIT

    async def run() -> tuple[list[bytes], list[bytes]]:
        async with AsyncTransactionProducer(address, producer_group="aio-tx", listener=Commit(),
                                            namespace="green") as p:
            result = await p.send_in_transaction(txmq.Message("orders", b"green-aio"))
            assert result.state == txmq.TransactionState.COMMITTED
        async with AsyncProducer(address, namespace="green") as p:
            await p.send(txmq.Message("orders", b"green-aio-plain"))
        bodies: dict[str, list[bytes]] = {}
        for ns in ("green", "blue"):  # green until both arrived; then blue until it has nothing more
            async with AsyncSimpleConsumer(address, consumer_group="aio-reader", subscriptions={"orders": "*"},
                                           namespace=ns, await_duration_seconds=0.3) as c:
                got = bodies[ns] = []
                deadline = asyncio.get_running_loop().time() + 15
                while asyncio.get_running_loop().time() < deadline:
                    batch = await c.receive(max_messages=32)
                    for m in batch:
                        got.append(m.body)
                        await c.ack(m)
                    done = {b"green-aio", b"green-aio-plain"} <= set(got) if ns == "green" else not batch
                    if done:
                        break
        return bodies["blue"], bodies["green"]

    blue, green = asyncio.run(run())
    assert {b"green-aio", b"green-aio-plain"} <= set(green) and not any(b.startswith(b"green") for b in blue)


class Commits(txmq.TransactionListener):
    def execute_local_transaction(self, message: txmq.TransactionMessage, arg: object) -> LocalState:
        return LocalState.COMMIT

    def check_local_transaction(self, message: txmq.TransactionMessage) -> LocalState:
        return LocalState.COMMIT


def test_a_multi_message_transaction_stays_in_its_namespace(ns_cluster: Cluster) -> None:
    """Every part of a multi-message transaction is named in the producer's namespace: its
    consumers there get all of it, the other namespace's none."""
    address = ns_cluster.nameserver_address
    with txmq.Admin(address, namespace="blue") as admin:
        admin.create_topic("audit", queue_count=1)
    ns_cluster.wait_route("blue%audit", 1, 15)
    with txmq.TransactionProducer(address, producer_group="multi", listener=Commits(), namespace="blue") as p:
        result = p.send_in_transaction([txmq.Message("orders", b"multi-1"), txmq.Message("audit", b"multi-2")])
    assert result.state == txmq.TransactionState.COMMITTED
    got = {}
    for ns, topic in (("blue", "orders"), ("blue", "audit"), ("green", "orders")):
        with txmq.SimpleConsumer(address, consumer_group="multi-reader", subscriptions={topic: "*"},
                                 namespace=ns, await_duration_seconds=0.3) as c:
            # The group reads the topic from its start: the other tests' messages come too.
            parts: list[bytes] = []

            def step(c: txmq.SimpleConsumer = c, parts: list[bytes] = parts) -> bool:
                received = c.receive(max_messages=32, invisible_duration_seconds=30.0)
                parts.extend(m.body for m in received if m.body.startswith(b"multi"))
                return not received
            wait_until(step, 20, interval=0.0, message=f"{ns}%{topic} read to its end")
            got[f"{ns}-{topic}"] = parts
    assert got == {"blue-orders": [b"multi-1"], "blue-audit": [b"multi-2"], "green-orders": []}
