"""A replicated shard between leaders (real processes, real etcd): the name servers know its
topics, answer NoLeaderError (UNAVAILABLE, retryable) for a topic only such shards hold, never
auto-create it on another shard, and the SDK's sends (sync and asyncio, transactional or not)
wait for the next leader within their send timeout instead of failing "topic not found".

The gap between leaders is made wide enough to hit every time: the name server forgets a
silent broker after 1 s (heartbeats every 0.2 s) while a dead leader's lease lasts 2 s, so
for about a second the shard's followers are registered and no leader is."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from typing import Any, Callable

import grpc
import pytest

import txmq
from services.proxy.protocol import definition_pb2 as rmq, service_pb2 as rmq_service, service_pb2_grpc
from txmq import _errors
from txmq.aio import AsyncProducer
from txmq.ids import TransactionId
from txmq.v1 import nameserver_pb2

from tests.support import presets
from tests.support.cluster import Cluster
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(240)

HEARTBEAT = {"TXMQ_HEARTBEAT_INTERVAL_SECONDS": "0.2"}
NAMESERVER_ENV = {**HEARTBEAT, "TXMQ_BROKER_EXPIRY_SECONDS": "1.0"}
BROKER_ENV = {**HEARTBEAT, "TXMQ_LEADER_LEASE_SECONDS": "2"}
CHECKER_ENV = presets.REPLICATED_CHECKER
#: Errors that say the topic is gone: never right while its shard only changes leaders.
GONE = (txmq.TopicNotFoundError, txmq.NoBrokerError)


def leaderless_cluster(make: Callable[..., Cluster], brokers: int = 1, proxies: int = 0) -> Cluster:
    return make(brokers=brokers, replication_factor=3, checker=True, broker_env=BROKER_ENV,
                nameserver_env=NAMESERVER_ENV, checker_env=CHECKER_ENV, proxies=proxies)


def proxy_send_half(address: str, topic: str) -> rmq_service.SendMessageResponse:
    """A half message sent through the proxy as an official RocketMQ client sends it."""
    message = rmq.Message(topic=rmq.Resource(name=topic), body=b"through the proxy")
    message.system_properties.message_id = uuid.uuid4().hex.upper()
    message.system_properties.message_type = rmq.TRANSACTION
    message.system_properties.body_encoding = rmq.IDENTITY
    message.system_properties.born_host = "test"
    with grpc.insecure_channel(address) as channel:
        return service_pb2_grpc.MessagingServiceStub(channel).SendMessage(
            rmq_service.SendMessageRequest(messages=[message]), timeout=15, metadata=[("x-mq-client-id", "test")])


def query_route(cluster: Cluster, topic: str, for_send: bool = False) -> list[nameserver_pb2.QueueRoute]:
    try:
        response = cluster.nameserver_stub().QueryRoute(
            nameserver_pb2.QueryRouteRequest(topic=topic, for_send=for_send), timeout=5.0)
    except grpc.RpcError as exc:
        raise _errors.error_from_rpc(exc) from None
    return list(response.queues)


class Listener(txmq.TransactionListener):
    def execute_local_transaction(self, message: Any, arg: Any) -> txmq.LocalTransactionState:
        return txmq.LocalTransactionState.COMMIT

    def check_local_transaction(self, message: Any) -> txmq.LocalTransactionState:
        return txmq.LocalTransactionState.COMMIT


class Sending:
    """Sends in a loop until stopped, recording (start, end) of every success and every failure."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.ok: list[tuple[float, float]] = []
        self.failed: list[tuple[float, float, BaseException]] = []
        self.threads: list[threading.Thread] = []

    def record(self, started: float, error: BaseException | None) -> None:
        with self.lock:
            if error is None:
                self.ok.append((started, time.monotonic()))
            else:
                self.failed.append((started, time.monotonic(), error))

    def loop(self, send: Callable[[int], Any]) -> None:
        i = 0
        while not self.stop.is_set():
            started = time.monotonic()
            try:
                send(i)
            except txmq.TxmqError as exc:
                self.record(started, exc)
                time.sleep(0.02)
            else:
                self.record(started, None)
            i += 1

    def spawn(self, target: Callable[[], Any]) -> None:
        thread = threading.Thread(target=target, daemon=True)
        thread.start()
        self.threads.append(thread)

    def join(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(30)


def test_sends_wait_for_the_next_leader_instead_of_failing_topic_not_found(fresh_cluster_factory, unique_name):
    cluster = leaderless_cluster(fresh_cluster_factory)
    topic = unique_name("topic")
    cluster.create_topic(topic, 1)
    leader = cluster.wait_leaders()["broker-0"]
    sending = Sending()
    producer = txmq.Producer(cluster.nameserver_address)
    transactions = txmq.TransactionProducer(cluster.nameserver_address, producer_group=unique_name("group"),
                                            listener=Listener())

    def aio() -> None:
        async def main() -> None:
            async with AsyncProducer(cluster.nameserver_address) as aproducer:
                i = 0
                while not sending.stop.is_set():
                    started = time.monotonic()
                    try:
                        await aproducer.send(txmq.Message(topic, f"aio-{i}".encode()))
                    except txmq.TxmqError as exc:
                        sending.record(started, exc)
                        await asyncio.sleep(0.02)
                    else:
                        sending.record(started, None)
                    i += 1
        asyncio.run(main())

    sending.spawn(lambda: sending.loop(lambda i: producer.send(txmq.Message(topic, f"sync-{i}".encode()))))
    sending.spawn(lambda: sending.loop(lambda i: transactions.send_in_transaction(
        txmq.Message(topic, f"txn-{i}".encode()))))
    sending.spawn(aio)
    consumer = txmq.SimpleConsumer(cluster.nameserver_address, consumer_group=unique_name("consumers"),
                                   subscriptions={topic: "*"}, await_duration_seconds=0.3)
    received: list[float] = []
    consumer_errors: list[BaseException] = []

    def consume() -> None:
        while not sending.stop.is_set():
            try:
                messages = consumer.receive(max_messages=32, invisible_duration_seconds=5)
            except txmq.TxmqError as exc:
                consumer_errors.append(exc)
                time.sleep(0.02)
                continue
            received.extend(time.monotonic() for _m in messages)
            for m in messages:
                try:
                    consumer.ack(m)
                except txmq.TxmqError:
                    pass  # redelivered: at least once
    sending.spawn(consume)
    answers: list[tuple[float, BaseException | int]] = []
    try:
        wait_until(lambda: len(sending.ok) >= 30, 30, message=lambda: f"no sends: {sending.failed[-3:]}")
        killed = time.monotonic()
        leader.kill()

        def new_leader_routed() -> bool:
            try:
                answers.append((time.monotonic(), len(query_route(cluster, topic))))
            except txmq.TxmqError as exc:
                answers.append((time.monotonic(), exc))
            return cluster.leader("broker-0") not in (None, leader)
        wait_until(new_leader_routed, 60, interval=0.02, ignore=(grpc.RpcError,))
        served = time.monotonic()
        wait_until(lambda: any(start > served for start, _end in sending.ok), 30,
                   message=lambda: f"no send succeeded after the fail-over: {sending.failed[-3:]}")
        wait_until(lambda: any(at > served for at in received), 30,
                   message=lambda: f"the consumer received nothing after the fail-over: {consumer_errors[-3:]}")
    finally:
        sending.join()
        producer.close()
        transactions.close()
        consumer.close()
    print(f"fail-over {served - killed:.2f} s; sends {len(sending.ok)} ok, {len(sending.failed)} failed "
          f"({sorted({type(e).__name__ for _s, _e, e in sending.failed})}); consumer errors "
          f"{sorted({type(e).__name__ for e in consumer_errors})}")
    # The name server answered the gap as "between leaders", naming the shard.
    gap = [(at, a) for at, a in answers if isinstance(a, BaseException)]
    assert gap and all(isinstance(a, txmq.NoLeaderError) for _at, a in gap), gap[:3]
    first = gap[0][1]
    assert first.shards == ["broker-0"] and first.topic == topic and first.retryable
    # No send failed saying the topic is gone; whatever failed is retryable.
    failures = [(round(started - killed, 2), repr(e)) for started, _end, e in sending.failed]
    assert not [e for _s, _e, e in sending.failed if isinstance(e, GONE)], failures
    assert all(e.retryable for _s, _e, e in sending.failed), failures
    # The consumer kept polling: whatever failed is retryable.
    assert all(e.retryable and not isinstance(e, GONE) for e in consumer_errors), consumer_errors[:3]
    # Sends in flight while no leader was routed waited for the next one and succeeded.
    assert any(started < gap[-1][0] and end > gap[0][0] for started, end in sending.ok), failures


def test_a_topic_of_a_shard_between_leaders_is_not_auto_created_elsewhere(fresh_cluster_factory, unique_name):
    cluster = leaderless_cluster(fresh_cluster_factory, brokers=2, proxies=1)
    only, both = unique_name("only"), unique_name("both")
    cluster.create_topic(only, 1)  # broker-0's alone (queues go to brokers by name)
    cluster.create_topic(both, 2)  # one queue on each shard
    leader = cluster.wait_leaders()["broker-0"]
    leader.kill()
    answers: list[Any] = []

    def answered() -> bool:
        try:  # a producer's lookup, auto-creation on: until the old leader leaves the routes
            routes = query_route(cluster, only, for_send=True)
        except txmq.TxmqError as exc:
            answers.append(exc)
            return True
        if any(q.broker_name != "broker-0" for q in routes):
            answers.append(routes)  # created on another shard
            return True
        return False
    wait_until(answered, 30, interval=0.02, ignore=(grpc.RpcError,),
               message="the name server routed the dead leader all along")
    err = answers[0]
    assert isinstance(err, txmq.NoLeaderError), f"between leaders, {only!r} was answered {err!r}"
    assert err.code == grpc.StatusCode.UNAVAILABLE and err.reason == "NO_LEADER" and err.retryable
    assert err.topic == only and err.shards == ["broker-0"] and "broker-0" in str(err)
    with pytest.raises(txmq.NoLeaderError):  # a subscription's lookup likewise
        query_route(cluster, only, for_send=False)
    # A topic a live shard holds too keeps routing there; an unknown one is still unknown.
    assert [(q.broker_name, q.queue_id) for q in query_route(cluster, both, for_send=True)] == [("broker-1", 0)]
    with pytest.raises(txmq.TopicNotFoundError):
        query_route(cluster, unique_name("unknown"), for_send=False)
    # The proxy waits for the next leader too (no official client retries a transactional send).
    sent = proxy_send_half(cluster.proxies[0].address, only)
    assert sent.status.code == rmq.OK, sent.status
    assert TransactionId.decode(sent.entries[0].transaction_id).broker == "broker-0"
    cluster.wait_leaders(60, not_on=leader)
    assert [(q.broker_name, q.queue_id) for q in query_route(cluster, only, for_send=True)] == [("broker-0", 0)]
    held = {b.name: {t.topic for t in b.topics} for b in cluster.list_brokers()}
    assert only not in held["broker-1"] and only in held["broker-0"]
