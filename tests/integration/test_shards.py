"""Adding a shard to a topic (``txmq topic expand``) and draining one (``txmq broker
drain``) with real processes under load: producers move to the new shard without a
restart; a drained shard takes no new messages, its pending transactions are still checked
and decided, consumers finish its queues, and only then is it reported empty; nothing is
lost and no transaction is stranded. Plus the refusals an operator meets.
"""

from __future__ import annotations

import json
import threading
import time

import grpc
import pytest

import txmq
from txmq.errors import ShardDrainingError, error_from_rpc
from txmq.ids import MessageId
from txmq.v1 import broker_pb2, broker_pb2_grpc, common_pb2
from tests.support.cli import txmq_cli
from tests.support.waiting import wait_until

LocalState = txmq.LocalTransactionState


def shard_of(message_id: str) -> str:
    return MessageId.decode(message_id).broker


class Consuming:
    """A consumer group reading (and acknowledging) a topic on a thread until stopped."""

    def __init__(self, cluster, topic: str, group: str) -> None:
        self.got: list[str] = []
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._consumer = txmq.SimpleConsumer(cluster.nameserver_address, consumer_group=group,
                                             subscriptions={topic: "*"}, await_duration_seconds=0.2,
                                             route_refresh_seconds=0.5)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                for m in self._consumer.receive(max_messages=32, invisible_duration_seconds=5):
                    self.got.append(m.message_id)
                    self._consumer.ack(m)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            if not self._stop.is_set():
                self.errors.append(exc)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._consumer.close()


def test_expand_adds_a_shard_producers_use_without_restart(fresh_cluster_factory, unique_name):
    cluster = fresh_cluster_factory(brokers=2)
    topic = unique_name("orders")
    created = cluster.create_topic(topic, queue_count=1)
    (first,) = [b.broker_name for b in created.brokers if b.queue_count]
    new = ({"broker-0", "broker-1"} - {first}).pop()
    consuming = Consuming(cluster, topic, unique_name("cg"))
    sent: list[str] = []
    try:
        with txmq.Producer(cluster.nameserver_address, route_refresh_seconds=0.5) as producer:
            for i in range(20):
                sent.append(producer.send(txmq.Message(topic, f"before-{i}".encode())).message_id)
            assert {shard_of(m) for m in sent} == {first}

            out = txmq_cli(cluster, "topic", "expand", topic, "--broker", new)
            assert out.returncode == 0, out.stderr
            assert json.loads(out.stdout)["brokers"] == {first: 1, new: 1}
            assert {q.broker_name for q in cluster.query_route(topic)} == {first, new}

            # The same producer, not restarted, sends to the new shard from its next route refresh.
            def reached_new() -> bool:
                sent.append(producer.send(txmq.Message(topic, b"after")).message_id)
                return shard_of(sent[-1]) == new
            wait_until(reached_new, timeout=15, interval=0.02, message="no send reached the new shard")
            for i in range(20):
                sent.append(producer.send(txmq.Message(topic, f"more-{i}".encode())).message_id)
        assert {shard_of(m) for m in sent[-20:]} == {first, new}
        wait_until(lambda: set(sent) <= set(consuming.got), timeout=30,
                   message=lambda: f"{len(set(sent) - set(consuming.got))} of {len(sent)} not consumed")
    finally:
        consuming.stop()
    assert not consuming.errors, consuming.errors

    again = txmq_cli(cluster, "topic", "expand", topic, "--broker", new)
    assert again.returncode == 1 and "already holds 1 queue" in again.stderr
    unknown_topic = txmq_cli(cluster, "topic", "expand", unique_name("nope"), "--broker", new)
    assert unknown_topic.returncode == 1 and "does not exist" in unknown_topic.stderr
    unknown_shard = txmq_cli(cluster, "topic", "expand", topic, "--broker", "broker-9")
    assert unknown_shard.returncode == 1 and "'broker-9' is not registered" in unknown_shard.stderr


class Listener(txmq.TransactionListener):
    """Commits, except every fifth transaction, left UNKNOWN and committed when checked."""

    def __init__(self) -> None:
        self.checked: set[str] = set()
        self._n = 0
        self._lock = threading.Lock()

    def execute_local_transaction(self, message: txmq.TransactionMessage, arg: object) -> LocalState:
        with self._lock:
            self._n += 1
            return LocalState.UNKNOWN if self._n % 5 == 0 else LocalState.COMMIT

    def check_local_transaction(self, message: txmq.TransactionMessage) -> LocalState:
        self.checked.add(message.transaction_id)
        return LocalState.COMMIT


def test_drain_under_load_loses_nothing_and_strands_no_transaction(fresh_cluster_factory, unique_name):
    cluster = fresh_cluster_factory(brokers=2, checker=True)
    topic = unique_name("orders")
    cluster.create_topic(topic, queue_count=4)
    assert {q.broker_name for q in cluster.query_route(topic)} == {"broker-0", "broker-1"}
    group = unique_name("pg")
    listener = Listener()
    results: list[tuple[txmq.TransactionResult, float]] = []  # (result, send started)
    errors: list[BaseException] = []
    stop = threading.Event()

    def load() -> None:
        try:
            with txmq.TransactionProducer(cluster.nameserver_address, producer_group=group, listener=listener,
                                          route_refresh_seconds=0.5) as producer:
                while not stop.is_set():
                    started = time.monotonic()
                    results.append((producer.send_in_transaction(txmq.Message(topic, b"x")), started))
                # Keep answering checks until every transaction is decided.
                wait_until(lambda: all(r.transaction_id in listener.checked or r.state is not None
                                       and r.state != txmq.TransactionState.PREPARED for r, _ in results)
                           or stop_checks.is_set(), timeout=60)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    stop_checks = threading.Event()
    consuming = Consuming(cluster, topic, unique_name("cg"))
    worker = threading.Thread(target=load, daemon=True)
    worker.start()
    try:
        wait_until(lambda: sum(shard_of(r.message_id) == "broker-1" for r, _ in results) >= 30, timeout=30,
                   message="no load on broker-1")
        started = txmq_cli(cluster, "broker", "drain", "broker-1")  # returns once the flag is stored
        draining_since = time.monotonic()
        assert started.returncode == 0 and json.loads(started.stdout)["draining"], started.stderr
        out = txmq_cli(cluster, "broker", "drain", "broker-1", "--wait", "60s")
        drained_at = time.monotonic()
        assert out.returncode == 0, out.stderr
        status = json.loads(out.stdout)
        assert status["empty"] and status["draining"] and status["pending_transactions"] == 0
        # The load went on meanwhile: every send begun once the shard drained went to broker-0
        # (chosen from the route, or moved there by broker-1's refusal).
        wait_until(lambda: any(s > drained_at for _, s in results[-5:]), timeout=30)
        stop.set()
        late = [r for r, s in results if s > draining_since]
        assert late and {shard_of(r.message_id) for r in late} == {"broker-0"}
        worker.join(90)
        assert not errors, errors

        # Every transaction committed (by its producer or by a check) is consumed; none is stranded.
        committed = {r.message_id for r, _ in results}
        wait_until(lambda: committed <= set(consuming.got), timeout=60,
                   message=lambda: f"{len(committed - set(consuming.got))} of {len(committed)} not consumed")
        pending = txmq_cli(cluster, "txn", "list", "--state", "pending", "--group", group)
        assert json.loads(pending.stdout)["transactions"] == []
        assert any(shard_of(r.message_id) == "broker-1" and r.transaction_id in listener.checked for r, _ in results)
    finally:
        stop.set()
        stop_checks.set()
        consuming.stop()
    assert not consuming.errors, consuming.errors

    # The broker itself refuses new messages (clients with a stale route), normal and half,
    # but answers a repeat of one it stored (a retry keeps its message id).
    stub = broker_pb2_grpc.BrokerServiceStub(cluster.channel(cluster.broker(1).address))
    for fields in ({}, {"type": common_pb2.MESSAGE_TYPE_TRANSACTION, "producer_group": group}):
        with pytest.raises(grpc.RpcError) as refused:
            stub.SendMessage(broker_pb2.SendMessageRequest(message=common_pb2.Message(
                topic=topic, body=b"late", message_id=MessageId.new("broker-1", 0).encode(), **fields)), timeout=10)
        error = error_from_rpc(refused.value)
        assert isinstance(error, ShardDrainingError) and error.retryable, error
    stored = next(r for r, _ in results if shard_of(r.message_id) == "broker-1")
    repeat = stub.SendMessage(broker_pb2.SendMessageRequest(message=common_pb2.Message(
        topic=topic, body=b"x", message_id=stored.message_id, type=common_pb2.MESSAGE_TYPE_TRANSACTION,
        producer_group=group, queue_id=MessageId.decode(stored.message_id).queue_id)), timeout=10)
    assert repeat.transaction_id == stored.transaction_id

    # The routes mark it; the other shard is now the topic's last and cannot be drained.
    assert {q.broker_name for q in cluster.query_route(topic) if q.draining} == {"broker-1"}
    last = txmq_cli(cluster, "broker", "drain", "broker-0")
    assert last.returncode == 1 and "last shard (not draining) of topic(s)" in last.stderr and topic in last.stderr
    unknown = txmq_cli(cluster, "broker", "drain", "broker-9")
    assert unknown.returncode == 1 and "'broker-9' is not registered" in unknown.stderr
    # Undone, broker-1 takes sends again.
    assert txmq_cli(cluster, "broker", "drain", "broker-1", "--undo").returncode == 0
    wait_until(lambda: not any(q.draining for q in cluster.query_route(topic)), timeout=10)
    with txmq.Producer(cluster.nameserver_address) as producer:
        wait_until(lambda: producer.send(txmq.Message(topic, b"back")).broker_name == "broker-1", timeout=15)


def test_both_sdks_read_the_drain_flag_and_send_nothing_to_a_draining_shard(fresh_cluster_factory, unique_name):
    """The routes mark a draining shard and new sends of the sync and the asyncio SDK go to
    the others at once: none is refused by the draining shard first (no send rerouted)."""
    import asyncio

    import txmq.aio
    cluster = fresh_cluster_factory(brokers=2)
    topic = unique_name("t")
    cluster.create_topic(topic, queue_count=4)
    assert txmq_cli(cluster, "broker", "drain", "broker-1").returncode == 0
    wait_until(lambda: any(q.draining for q in cluster.query_route(topic)), timeout=10)

    with txmq.Producer(cluster.nameserver_address) as producer:
        shards = {producer.send(txmq.Message(topic, b"%d" % i)).broker_name for i in range(12)}
        assert shards == {"broker-0"} and producer.routing_stats().rerouted == 0

    async def aio_sends() -> tuple[set[str], int]:
        async with txmq.aio.AsyncProducer(cluster.nameserver_address) as aio_producer:
            receipts = [await aio_producer.send(txmq.Message(topic, b"%d" % i)) for i in range(12)]
            return {r.broker_name for r in receipts}, aio_producer.routing_stats().rerouted
    assert asyncio.run(aio_sends()) == ({"broker-0"}, 0)


def test_backup_and_drain_work_per_replica_group(fresh_cluster_factory, unique_name, tmp_path):
    """On replicated shards the commands reach each shard's leader; the drain flag is
    replicated, so it survives a change of leader; a replicated shard's backup restores
    into a fresh broker."""
    cluster = fresh_cluster_factory(brokers=2, replication_factor=2, min_insync_replicas=1)
    leaders = cluster.wait_leaders()
    topic = unique_name("orders")
    cluster.create_topic(topic, queue_count=4)
    cluster.wait_route(topic, 4)
    with txmq.Producer(cluster.nameserver_address) as producer:
        sent = [producer.send(txmq.Message(topic, f"m{i}".encode())).message_id for i in range(40)]
    assert {shard_of(m) for m in sent} == {"broker-0", "broker-1"}

    out = txmq_cli(cluster, "broker", "backup", "broker-0", "--to", str(tmp_path / "backup"))
    assert out.returncode == 0, out.stderr
    manifest = json.loads(out.stdout)
    assert manifest["replication_factor"] == 2
    assert manifest["replica_id"] == int(leaders["broker-0"].env["TXMQ_REPLICA_ID"])
    assert manifest["broker_address"] == leaders["broker-0"].address

    assert json.loads(txmq_cli(cluster, "broker", "drain", "broker-1").stdout)["draining"]
    old = int(leaders["broker-1"].env["TXMQ_REPLICA_ID"])

    def in_sync() -> bool:
        listed = cluster.list_brokers()
        b = next((b for b in listed if b.name == "broker-1"), None)
        return b is not None and len(b.replication.in_sync_replicas) == 2
    wait_until(in_sync, timeout=30, message="broker-1's replicas not in sync")
    moved = txmq_cli(cluster, "broker", "elect", "broker-1", "--replica", str(1 - old))
    assert moved.returncode == 0, moved.stderr
    new = cluster.wait_leaders()["broker-1"]
    assert int(new.env["TXMQ_REPLICA_ID"]) == 1 - old
    # The new leader drains too: it refuses new sends, the routes mark it, producers avoid it.
    stub = broker_pb2_grpc.BrokerServiceStub(cluster.channel(new.address))
    with pytest.raises(grpc.RpcError) as refused:
        stub.SendMessage(broker_pb2.SendMessageRequest(message=common_pb2.Message(
            topic=topic, body=b"late", message_id=MessageId.new("broker-1", 0).encode())), timeout=10)
    assert isinstance(error_from_rpc(refused.value), ShardDrainingError)
    wait_until(lambda: {q.broker_name for q in cluster.query_route(topic) if q.draining} == {"broker-1"}, timeout=10)
    status = json.loads(txmq_cli(cluster, "broker", "drain", "broker-1", "--status").stdout)
    assert status["draining"] and status["unread_topics"] == [topic]  # nobody consumed: not empty
    assert not status["empty"]
    with txmq.Producer(cluster.nameserver_address) as producer:
        assert {producer.send(txmq.Message(topic, b"after")).broker_name for _ in range(10)} == {"broker-0"}
        # Chosen from the route: no send was tried on broker-1 and refused.
        assert producer.routing_stats().rerouted == 0

    # The replicated shard's backup restores into a fresh (single-replica) broker.
    target = fresh_cluster_factory(brokers=1)
    target.stop_broker(0)
    restored = txmq_cli(target, "broker", "restore", "--from", str(tmp_path / "backup"),
                        "--data-dir", target.brokers[0].env["TXMQ_DATA_DIR"], "--replace")
    assert restored.returncode == 0, restored.stderr
    target.restart_broker(0)
    target.wait_route(topic, 2)
    want = {m for m in sent if shard_of(m) == "broker-0"}
    got: set[str] = set()
    with txmq.SimpleConsumer(target.nameserver_address, consumer_group=unique_name("cg"),
                             subscriptions={topic: "*"}, await_duration_seconds=0.2) as consumer:
        def all_back() -> bool:
            for m in consumer.receive(max_messages=32):
                got.add(m.message_id)
                consumer.ack(m)
            return want <= got
        wait_until(all_back, timeout=30, message=lambda: f"{len(want - got)} missing")
    assert got == want
