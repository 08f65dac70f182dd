"""The SDK against real name server and broker processes: what a user of ``txmq`` checks.

Assumptions about the fixtures (tests/conftest.py): ``cluster`` is one name server and one
broker shared by the session, with sub-second check timings and no checker, so a
transaction left UNKNOWN stays PREPARED; ``fresh_cluster_factory(brokers=..,
broker_env={"TXMQ_MAX_DELIVERY_ATTEMPTS": "3"})`` starts a cluster of its own; topics are
created with ``cluster.create_topic(name, queue_count)``.

"Never visible" is shown with a marker: on a one-queue topic consumers see committed
messages in commit order, so once a message sent *after* the one under test has arrived,
the one under test would have arrived before it if it were visible. Waits are deadlines.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

import grpc
import pytest

import txmq
from txmq.ids import MessageId
from txmq.v1 import broker_pb2, broker_pb2_grpc, common_pb2
from tests.support.metrics import metric_sum
from tests.support.relay import SlowStartRelay
from tests.support.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
LocalState = txmq.LocalTransactionState
AWAIT_SECONDS = 1.0


class RecordingListener(txmq.TransactionListener):
    """Answers ``decide(message)`` (or raises it if it is an exception) and records calls."""

    def __init__(self, decide: Callable[[txmq.TransactionMessage], object]) -> None:
        self.decide = decide
        self.executed: list[tuple[txmq.TransactionMessage, object]] = []

    def execute_local_transaction(self, message: txmq.TransactionMessage, arg: object) -> LocalState:
        self.executed.append((message, arg))
        outcome = self.decide(message)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome  # type: ignore[return-value]

    def check_local_transaction(self, message: txmq.TransactionMessage) -> LocalState:
        return LocalState.UNKNOWN


def start_workers(count: int, work: Callable[[int], None], errors: list[BaseException]) -> list[threading.Thread]:
    """Runs ``work(i)`` on ``count`` started threads; what one raises goes to ``errors``."""
    def run(i: int) -> None:
        try:
            work(i)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    return threads


def consumer(cluster, group: str, subscriptions: dict[str, str]) -> txmq.SimpleConsumer:
    return txmq.SimpleConsumer(cluster.nameserver_address, consumer_group=group,
                               subscriptions=subscriptions, await_duration_seconds=AWAIT_SECONDS)


def receive_until(c: txmq.SimpleConsumer, done: Callable[[list[txmq.ReceivedMessage]], bool],
                  timeout: float = 20.0, ack: bool = True) -> list[txmq.ReceivedMessage]:
    """Receives (and acknowledges) until ``done(all received so far)``, within ``timeout``."""
    got: list[txmq.ReceivedMessage] = []

    def step() -> bool:
        batch = c.receive(max_messages=32, invisible_duration_seconds=30.0)
        got.extend(batch)
        if ack and batch:
            assert c.ack_many(batch) == [None] * len(batch)
        return done(got)

    wait_until(step, timeout, interval=0.0, message=lambda: f"received {[m.body for m in got]}")
    return got


def until_body(body: bytes) -> Callable[[list[txmq.ReceivedMessage]], bool]:
    return lambda got: any(m.body == body for m in got)


def bodies_before_marker(cluster, topic: str, group: str, marker: bytes,
                         filter_expression: str = "*") -> list[bytes]:
    with consumer(cluster, group, {topic: filter_expression}) as c:
        got = receive_until(c, until_body(marker))
    bodies = [m.body for m in got]
    return bodies[:bodies.index(marker)]


# ------------------------------------------------------------------------- normal messages

def test_send_then_receive_carries_every_field(cluster, unique_name):
    topic, group = unique_name("topic"), unique_name("group")
    cluster.create_topic(topic, queue_count=2)
    with txmq.Producer(cluster.nameserver_address) as producer:
        receipt = producer.send(txmq.Message(topic, b"hello", tag="TagA", keys=("k1", "k2"),
                                             properties={"p": "v"}))
    assert receipt.topic == topic
    assert MessageId.decode(receipt.message_id).broker == receipt.broker_name
    assert MessageId.decode(receipt.message_id).queue_id == receipt.queue_id
    assert receipt.broker_name in {b.name for b in cluster.brokers}
    assert receipt.queue_offset >= 0

    with consumer(cluster, group, {topic: "*"}) as c:
        [message] = receive_until(c, lambda got: len(got) >= 1, ack=False)
        assert (message.topic, message.original_topic, message.body) == (topic, topic, b"hello")
        assert (message.tag, message.keys, dict(message.properties)) == ("TagA", ("k1", "k2"), {"p": "v"})
        assert message.message_id == receipt.message_id
        assert (message.broker_name, message.queue_id, message.queue_offset) == (
            receipt.broker_name, receipt.queue_id, receipt.queue_offset)
        assert message.delivery_attempt == 1
        assert message.transaction_id == ""
        assert message.consumer_group == group
        assert message.invisible_until > message.visible_at >= message.stored_at
        c.ack(message)
        with pytest.raises((txmq.NotFoundError, txmq.FailedPreconditionError)):
            c.ack(message)  # acknowledged already: the handle is stale


def test_a_name_server_slow_to_answer_a_new_connection_is_still_reached(cluster, unique_name):
    """A loaded machine may not run the name server for a while as a connection starts: its
    HTTP/2 SETTINGS frame comes late (here 0.5 s, through a relay). Clients wait for it as
    long as their call allows; before, every channel gave a connection attempt 100 ms and
    the call failed (UNAVAILABLE: "connection attempt timed out before receiving SETTINGS
    frame"): the Admin's at once, the producer's only after its retries had grown the
    attempts' backoff past the delay."""
    topic = unique_name("slow-start")
    with SlowStartRelay(cluster.nameserver_address, first_reply_delay_seconds=0.5) as relay:
        with txmq.Admin(relay.address) as admin:
            admin.create_topic(topic, queue_count=1)
        with txmq.Producer(relay.address, max_attempts=1) as producer:
            sent = producer.send(txmq.Message(topic, b"through a slow name server"))
        assert relay.connections >= 1  # (the channels share one connection)
    with consumer(cluster, unique_name("group"), {topic: "*"}) as c:
        got = receive_until(c, lambda got: len(got) >= 1)
    assert [(m.message_id, m.body) for m in got] == [(sent.message_id, b"through a slow name server")]


def test_broker_refusal_raises_the_same_error_class(cluster, unique_name):
    topic = unique_name("topic")
    cluster.create_topic(topic, queue_count=1)
    # The client allows more than the broker (4 MiB by default): the broker refuses.
    with txmq.Producer(cluster.nameserver_address, max_body_bytes=8 * 1024 * 1024) as producer:
        with pytest.raises(txmq.MessageTooLargeError) as info:
            producer.send(txmq.Message(topic, b"x" * (4 * 1024 * 1024 + 1)))
    assert info.value.size == 4 * 1024 * 1024 + 1
    assert info.value.limit == 4 * 1024 * 1024


def test_many_threads_share_one_producer(cluster, unique_name):
    topic, group = unique_name("topic"), unique_name("group")
    cluster.create_topic(topic, queue_count=4)
    receipts: list[txmq.SendReceipt] = []
    errors: list[BaseException] = []

    with txmq.Producer(cluster.nameserver_address) as producer:
        def work(t: int) -> None:
            for i in range(50):
                receipts.append(producer.send(txmq.Message(topic, f"{t}-{i}".encode())))

        for t in start_workers(8, work, errors):
            t.join(60)
    assert errors == []
    assert len({r.message_id for r in receipts}) == 400
    assert len({(r.broker_name, r.queue_id, r.queue_offset) for r in receipts}) == 400
    assert {r.queue_id for r in receipts} == {0, 1, 2, 3}

    with consumer(cluster, group, {topic: "*"}) as c:
        got = receive_until(c, lambda got: len({m.message_id for m in got}) >= 400)
    assert {m.message_id for m in got} == {r.message_id for r in receipts}


def test_a_burst_of_threads_on_a_new_producer_asks_the_route_once(cluster, unique_name):
    """64 threads sending at once through a producer that has no route yet share one
    QueryRoute: the others wait for it instead of queueing 64 calls on the name server (on a
    slow machine some of those timed out, failing their sends)."""
    topic = unique_name("topic")
    cluster.create_topic(topic, queue_count=2)
    port = cluster.nameservers[0].metrics_port

    def lookups() -> float:
        return metric_sum(port, "txmq_rpc_duration_seconds_count", {"method": "QueryRoute"})

    before = lookups()
    go = threading.Barrier(64)
    receipts: list[txmq.SendReceipt] = []
    errors: list[BaseException] = []
    with txmq.Producer(cluster.nameserver_address) as producer:
        def work(t: int) -> None:
            go.wait()
            receipts.append(producer.send(txmq.Message(topic, b"%d" % t)))

        for t in start_workers(64, work, errors):
            t.join(60)
    assert errors == [] and len({r.message_id for r in receipts}) == 64
    # The name server records a call after answering it: wait for the sample, then count.
    wait_until(lambda: lookups() > before, timeout=10)
    assert lookups() - before == 1


def test_threads_sharing_a_producer_split_into_two_lanes_and_merge_back(cluster, unique_name, monkeypatch):
    """Eight threads in transactions at once: the stream spreads them over two lanes (two
    Produce calls, so one lane's callers are woken while the other's are with the broker);
    two threads: one lane again. Every transaction commits and is delivered once."""
    import txmq._produce_stream

    monkeypatch.setattr(txmq._produce_stream, "LANE_WINDOW_SECONDS", 0.05)
    topic, group = unique_name("topic"), unique_name("group")
    cluster.create_topic(topic, queue_count=2)
    results: list[txmq.TransactionResult] = []
    errors: list[BaseException] = []
    running = [threading.Event() for _ in range(8)]
    for event in running:
        event.set()
    listener = RecordingListener(lambda m: LocalState.COMMIT)
    with txmq.TransactionProducer(cluster.nameserver_address, producer_group=unique_name("pg"),
                                  listener=listener, answer_checks=False) as producer:
        producer.send_in_transaction(txmq.Message(topic, b"warm-up"))
        stream = producer._client.produce_stream(cluster.brokers[0].address)

        def work(t: int) -> None:
            while running[t].is_set():
                results.append(producer.send_in_transaction(txmq.Message(topic, f"{t}".encode())))

        threads = start_workers(8, work, errors)
        try:
            wait_until(lambda: stream.lanes == 2 and all(stream._sessions), 30,
                       message="eight threads never got two lanes")
            lane_requests = len(results)
            wait_until(lambda: len(results) > lane_requests + 50, 30)
            for event in running[2:]:
                event.clear()
            for t in threads[2:]:
                t.join(30)
            wait_until(lambda: stream.lanes == 1, 30, message="two threads kept two lanes")
        finally:
            for event in running:
                event.clear()
            for t in threads:
                t.join(30)
    assert errors == []
    assert {r.state for r in results} == {txmq.TransactionState.COMMITTED}
    with consumer(cluster, group, {topic: "*"}) as c:
        got = receive_until(c, lambda got: len(got) >= len(results) + 1)
    assert sorted(m.message_id for m in got) == sorted([r.message_id for r in results] + [
        listener.executed[0][0].message_id])


def test_producer_fails_in_flight_sends_and_recovers_when_the_broker_restarts(fresh_cluster_factory, unique_name):
    cluster = fresh_cluster_factory()
    topic = unique_name("topic")
    cluster.create_topic(topic, queue_count=2)
    outcomes: list[object] = []
    give_up = time.monotonic() + 60.0

    with txmq.Producer(cluster.nameserver_address, max_attempts=2, send_timeout_seconds=2.0) as producer:
        before = producer.send(txmq.Message(topic, b"before"))

        def work() -> None:  # sends until the dead broker makes one fail
            while time.monotonic() < give_up:
                try:
                    outcomes.append(producer.send(txmq.Message(topic, b"during")))
                except txmq.TxmqError as err:
                    outcomes.append(err)
                    return

        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        wait_until(lambda: len(outcomes) >= 20, 10.0, message="no sends completed")
        cluster.kill_broker(0)
        for t in threads:
            t.join(30.0)
        assert not any(t.is_alive() for t in threads), "a send hung after the broker died"
        errors = [o for o in outcomes if isinstance(o, txmq.TxmqError)]
        assert len(errors) == 4 and all(e.retryable for e in errors), errors

        cluster.restart_broker(0)
        after = wait_until(lambda: producer.send(txmq.Message(topic, b"after")), 15.0,
                           ignore=(txmq.UnavailableError, txmq.DeadlineExceededError))
    assert after.broker_name == before.broker_name


# ------------------------------------------------------------------------- transactions

def test_commit_is_visible_once(cluster, unique_name):
    topic, group = unique_name("topic"), unique_name("group")
    cluster.create_topic(topic, queue_count=1)
    listener = RecordingListener(lambda m: LocalState.COMMIT)
    with txmq.TransactionProducer(cluster.nameserver_address, producer_group=unique_name("pg"),
                                  listener=listener) as producer:
        result = producer.send_in_transaction(txmq.Message(topic, b"committed", tag="T"), arg=42)
        producer.send(txmq.Message(topic, b"marker"))
    assert result.local_state is LocalState.COMMIT
    assert result.state is txmq.TransactionState.COMMITTED
    assert result.end_error is None
    [(half, arg)] = listener.executed
    assert arg == 42
    assert (half.transaction_id, half.message_id) == (result.transaction_id, result.message_id)
    assert (half.topic, half.body, half.tag) == (topic, b"committed", "T")

    with consumer(cluster, group, {topic: "*"}) as c:
        got = receive_until(c, until_body(b"marker"))
    assert [m.body for m in got] == [b"committed", b"marker"]
    assert got[0].message_id == result.message_id
    assert got[0].transaction_id == result.transaction_id

    # The broker's own record agrees: committed by the client.
    address = {b.name: b.address for b in cluster.brokers}[result.broker_name]
    with grpc.insecure_channel(address) as channel:
        row = broker_pb2_grpc.BrokerServiceStub(channel).GetTransaction(
            broker_pb2.GetTransactionRequest(transaction_id=result.transaction_id), timeout=5).transaction
    assert row.state == common_pb2.TRANSACTION_STATE_COMMITTED
    assert row.resolution_source == common_pb2.TRANSACTION_SOURCE_CLIENT


@pytest.mark.parametrize("decide, local_state, state", [
    (lambda m: LocalState.ROLLBACK, LocalState.ROLLBACK, txmq.TransactionState.ROLLED_BACK),
    (lambda m: LocalState.UNKNOWN, LocalState.UNKNOWN, txmq.TransactionState.PREPARED),
    (lambda m: None, LocalState.UNKNOWN, txmq.TransactionState.PREPARED),
    (lambda m: RuntimeError("database down"), LocalState.UNKNOWN, txmq.TransactionState.PREPARED),
], ids=["rollback", "unknown", "none-is-unknown", "raising-is-unknown"])
def test_undecided_or_rolled_back_is_never_visible(cluster, unique_name, decide, local_state, state):
    topic = unique_name("topic")
    cluster.create_topic(topic, queue_count=1)
    listener = RecordingListener(decide)
    with txmq.TransactionProducer(cluster.nameserver_address, producer_group=unique_name("pg"),
                                  listener=listener) as producer:
        result = producer.send_in_transaction(txmq.Message(topic, b"hidden"))
        assert len(listener.executed) == 1
        assert result.local_state is local_state
        assert result.state is state
        assert result.end_error is None
        producer.send(txmq.Message(topic, b"end"))  # the marker
    assert bodies_before_marker(cluster, topic, unique_name("group"), b"end") == []


def test_failed_half_send_does_not_run_the_local_transaction(cluster, unique_name):
    topic = unique_name("topic")
    cluster.create_topic(topic, queue_count=1)
    listener = RecordingListener(lambda m: LocalState.COMMIT)
    with txmq.TransactionProducer(cluster.nameserver_address, producer_group=unique_name("pg"),
                                  listener=listener, max_body_bytes=8 * 1024 * 1024) as producer:
        with pytest.raises(txmq.MessageTooLargeError):  # refused by the broker
            producer.send_in_transaction(txmq.Message(topic, b"x" * (4 * 1024 * 1024 + 1)))
        with pytest.raises(txmq.SystemTopicError):  # refused by the client
            producer.send_in_transaction(txmq.Message("%DLQ%" + unique_name("g"), b"x"))
    assert listener.executed == []


def test_check_immunity_and_group_reach_the_broker(cluster, unique_name):
    topic, group = unique_name("topic"), unique_name("pg")
    cluster.create_topic(topic, queue_count=1)
    with txmq.TransactionProducer(cluster.nameserver_address, producer_group=group, client_id="me-1",
                                  listener=RecordingListener(lambda m: LocalState.UNKNOWN)) as producer:
        result = producer.send_in_transaction(txmq.Message(topic, b"x", check_immunity_seconds=3600.0))
    address = {b.name: b.address for b in cluster.brokers}[result.broker_name]
    with grpc.insecure_channel(address) as channel:
        row = broker_pb2_grpc.BrokerServiceStub(channel).GetTransaction(
            broker_pb2.GetTransactionRequest(transaction_id=result.transaction_id), timeout=5).transaction
    assert (row.producer_group, row.producer_client_id, row.topic) == (group, "me-1", topic)
    assert row.state == common_pb2.TRANSACTION_STATE_PREPARED
    # The first check is due after the message's own immunity, not the broker's 1 s default.
    assert row.next_check_at_ms - row.prepared_at_ms >= 3_000_000


# ------------------------------------------------------------------------- consumers

def test_consumer_groups_are_independent(cluster, unique_name):
    topic = unique_name("topic")
    cluster.create_topic(topic, queue_count=2)
    with txmq.Producer(cluster.nameserver_address) as producer:
        ids = {producer.send(txmq.Message(topic, f"m{i}".encode())).message_id for i in range(10)}
    for group in (unique_name("a"), unique_name("b")):
        with consumer(cluster, group, {topic: "*"}) as c:
            got = receive_until(c, lambda got: {m.message_id for m in got} >= ids)
        assert {m.message_id for m in got} == ids
        assert all(m.delivery_attempt == 1 for m in got)


def test_tag_filter(cluster, unique_name):
    topic = unique_name("topic")
    cluster.create_topic(topic, queue_count=1)
    with txmq.Producer(cluster.nameserver_address) as producer:
        for body, tag in [(b"1", "TagA"), (b"2", "TagB"), (b"3", "TagC"), (b"4", "TagB"), (b"end", "TagC")]:
            producer.send(txmq.Message(topic, body, tag=tag))
    assert bodies_before_marker(cluster, topic, unique_name("g"), b"end", "TagA || TagC") == [b"1", b"3"]
    assert bodies_before_marker(cluster, topic, unique_name("g"), b"end", "*") == [b"1", b"2", b"3", b"4"]


def test_change_invisible_duration_redelivers_with_next_attempt(cluster, unique_name):
    topic, group = unique_name("topic"), unique_name("group")
    cluster.create_topic(topic, queue_count=1)
    with txmq.Producer(cluster.nameserver_address) as producer:
        receipt = producer.send(txmq.Message(topic, b"again"))
    with consumer(cluster, group, {topic: "*"}) as c:
        [first] = receive_until(c, lambda got: len(got) >= 1, ack=False)
        assert first.delivery_attempt == 1
        changed = c.change_invisible_duration(first, 0.2)
        assert changed.receipt_handle  # the broker may keep the handle (same delivery) or issue a new one
        assert changed.message_id == receipt.message_id
        assert changed.invisible_until < first.invisible_until
        [second] = receive_until(c, lambda got: len(got) >= 1, ack=False)
        assert second.message_id == receipt.message_id
        assert second.delivery_attempt == 2
        with pytest.raises((txmq.NotFoundError, txmq.FailedPreconditionError)):
            c.ack(first)  # redelivered since: that handle is stale
        c.ack(second)


def test_a_consumer_of_one_topic_on_one_broker_receives_with_one_call_each_time(cluster, unique_name):
    """With a single (topic, broker) a receive is its long poll alone: no empty pass before
    it (at low rates that pass was one ReceiveMessages in two)."""
    topic, group = unique_name("topic"), unique_name("group")
    cluster.create_topic(topic, queue_count=1)
    port = cluster.brokers[0].metrics_port

    def calls() -> float:
        return metric_sum(port, "txmq_rpc_duration_seconds_count", {"method": "ReceiveMessages"})

    with txmq.Producer(cluster.nameserver_address) as producer, consumer(cluster, group, {topic: "*"}) as c:
        before = calls()
        assert c.receive(max_messages=8, invisible_duration_seconds=30.0) == []  # waits AWAIT_SECONDS
        wait_until(lambda: calls() >= before + 1, 10, message="the receive never reached the broker")
        assert calls() == before + 1
        receipt = producer.send(txmq.Message(topic, b"one"))
        [message] = c.receive(max_messages=8, invisible_duration_seconds=30.0)
        assert message.message_id == receipt.message_id
        wait_until(lambda: calls() >= before + 2, 10, message="the receive never reached the broker")
        assert calls() == before + 2
        c.ack(message)


def test_ack_many_reports_each_entry(cluster, unique_name):
    topic, group = unique_name("topic"), unique_name("group")
    cluster.create_topic(topic, queue_count=2)
    with txmq.Producer(cluster.nameserver_address) as producer:
        for i in range(5):
            producer.send(txmq.Message(topic, f"m{i}".encode()))
    with consumer(cluster, group, {topic: "*"}) as c:
        got = receive_until(c, lambda got: len(got) >= 5, ack=False)
        assert c.ack_many(got) == [None] * 5
        errors = c.ack_many(got)
    assert len(errors) == 5
    assert all(isinstance(e, (txmq.NotFoundError, txmq.FailedPreconditionError)) for e in errors)


def test_two_brokers_send_and_receive(fresh_cluster_factory, unique_name):
    cluster = fresh_cluster_factory(brokers=2)
    topic, group = unique_name("topic"), unique_name("group")
    cluster.create_topic(topic, queue_count=4)
    with txmq.Producer(cluster.nameserver_address) as producer:
        receipts = [producer.send(txmq.Message(topic, f"m{i}".encode())) for i in range(20)]
    assert {r.broker_name for r in receipts} == {"broker-0", "broker-1"}
    with consumer(cluster, group, {topic: "*"}) as c:
        got = receive_until(c, lambda got: len({m.message_id for m in got}) >= 20)
    assert {m.message_id for m in got} == {r.message_id for r in receipts}
    assert {m.broker_name for m in got} == {"broker-0", "broker-1"}


def test_push_consumer_acknowledges_successes(cluster, unique_name):
    topic, group = unique_name("topic"), unique_name("group")
    cluster.create_topic(topic, queue_count=2)
    seen: list[txmq.ReceivedMessage] = []
    lock = threading.Lock()

    def listener(message: txmq.ReceivedMessage) -> txmq.ConsumeResult:
        with lock:
            seen.append(message)
        return txmq.ConsumeResult.SUCCESS

    with txmq.Producer(cluster.nameserver_address) as producer:
        ids = {producer.send(txmq.Message(topic, f"m{i}".encode())).message_id for i in range(30)}
    with txmq.PushConsumer(cluster.nameserver_address, consumer_group=group, subscriptions={topic: "*"},
                           listener=listener, consume_threads=4, await_duration_seconds=AWAIT_SECONDS):
        wait_until(lambda: {m.message_id for m in seen} >= ids, 20.0, message=lambda: f"{len(seen)} seen")
    assert all(m.delivery_attempt == 1 for m in seen)


def test_push_consumer_failing_message_lands_in_dead_letter_topic(fresh_cluster_factory, unique_name):
    # Assumption: the broker reads TXMQ_MAX_DELIVERY_ATTEMPTS (BrokerConfig.max_delivery_attempts).
    cluster = fresh_cluster_factory(broker_env={"TXMQ_MAX_DELIVERY_ATTEMPTS": "3"})
    topic, group = unique_name("topic"), unique_name("group")
    cluster.create_topic(topic, queue_count=1)
    attempts: list[int] = []

    def failing(message: txmq.ReceivedMessage) -> txmq.ConsumeResult:
        attempts.append(message.delivery_attempt)
        if message.delivery_attempt == 2:
            raise RuntimeError("an exception counts as a failure")
        return txmq.ConsumeResult.FAILURE

    with txmq.Producer(cluster.nameserver_address) as producer:
        receipt = producer.send(txmq.Message(topic, b"poison", tag="P"))
    dlq = "%DLQ%" + group
    with txmq.PushConsumer(cluster.nameserver_address, consumer_group=group, subscriptions={topic: "*"},
                           listener=failing, retry_backoff_seconds=0.05,
                           await_duration_seconds=AWAIT_SECONDS):
        with consumer(cluster, unique_name("redrive"), {dlq: "*"}) as c:
            got = wait_until(lambda: c.receive(max_messages=4), 30.0,
                             message=lambda: f"nothing in {dlq}; attempts {attempts}",
                             ignore=(txmq.TopicNotFoundError,))
    [dead] = got
    assert dead.topic == dlq
    assert dead.original_topic == topic
    assert (dead.message_id, dead.body, dead.tag) == (receipt.message_id, b"poison", "P")
    assert attempts == [1, 2, 3]


# ------------------------------------------------------------------------- examples

@pytest.mark.parametrize("script", ["transaction_producer.py", "simple_consumer.py"])
def test_example_runs(cluster, unique_name, script):
    env = {**os.environ, "TXMQ_NAMESERVER": cluster.nameserver_address}
    done = subprocess.run([sys.executable, str(REPO / "examples" / script), "--topic", unique_name("ex")],
                          env=env, capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip()
