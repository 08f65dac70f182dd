"""flush=sync over real processes: nothing is answered before the WAL holding it (and
everything it read) is synced, the broker keeps serving while a sync is slow, and a dead
sync helper stops the broker without losing anything acknowledged.

The WAL is synced by the broker's helper process (services/broker/store/walsync.py);
these tests hold it with SIGSTOP to make a sync last as long as they need."""

from __future__ import annotations

import os
import signal
import threading
from typing import Any, Callable

import psutil
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

import txmq
import txmq._pipeline
from tests.support.metrics import metric
from tests.support.waiting import wait_until
from txmq.v1 import admin_pb2, common_pb2


def _sync_helper(broker_pid: int) -> psutil.Process:
    helpers = [p for p in psutil.Process(broker_pid).children()
               if any(part.endswith("walsync.py") for part in p.cmdline())]
    assert len(helpers) == 1, f"expected one WAL sync helper under the broker, found {helpers}"
    return helpers[0]


def _in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    box: list[Any] = []

    def run() -> None:
        try:
            box.append(fn())
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            box.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, box


@pytest.fixture
def held(fresh_cluster_factory):
    """A one-broker cluster, a topic, and a way to hold the WAL sync (released at teardown)."""
    cluster = fresh_cluster_factory()
    cluster.create_topic("durable", queue_count=1)
    helper = _sync_helper(cluster.brokers[0].pid)
    stopped: list[bool] = []

    def hold() -> None:
        os.kill(helper.pid, signal.SIGSTOP)
        stopped.append(True)

    try:
        yield cluster, hold, lambda: os.kill(helper.pid, signal.SIGCONT)
    finally:
        if stopped and helper.is_running():
            os.kill(helper.pid, signal.SIGCONT)


def test_a_send_and_a_receive_are_answered_only_after_the_sync(held) -> None:
    cluster, hold, release = held
    broker = cluster.brokers[0]
    with txmq.Producer(cluster.nameserver_address, send_timeout_seconds=30) as producer, \
            txmq.SimpleConsumer(cluster.nameserver_address, consumer_group="g", subscriptions={"durable": "*"},
                                await_duration_seconds=20) as consumer:
        producer.send(txmq.Message("durable", b"before"))
        assert [m.body for m in consumer.receive(max_messages=8)] == [b"before"]
        writes = metric(broker.metrics_port, "txmq_store_writes_total")
        hold()
        sending, sent = _in_thread(lambda: producer.send(txmq.Message("durable", b"held")))
        # The broker applied the send (its write is in RocksDB's WAL, not synced) ...
        wait_until(lambda: metric(broker.metrics_port, "txmq_store_writes_total") > writes, 10,
                   message="the broker never applied the send")
        receiving, received = _in_thread(lambda: consumer.receive(max_messages=8))
        # ... and keeps serving what depends on no unsynced write,
        health = health_pb2_grpc.HealthStub(cluster.channel(broker.address))
        assert health.Check(health_pb2.HealthCheckRequest(), timeout=5).status == \
            health_pb2.HealthCheckResponse.SERVING
        # but neither the send's producer nor a consumer hears of the message while the
        # sync is held (the helper is stopped: no answer can be on its way).
        assert not sent and not received
        release()
        sending.join(30)
        receiving.join(30)
    assert isinstance(sent[0], txmq.SendReceipt), sent
    assert [m.body for m in received[0]] == [b"held"]
    assert metric(broker.metrics_port, "txmq_store_wal_syncs_total") >= 1
    # The held sync is in the latency histogram, and it made the held write durable.
    assert metric(broker.metrics_port, "txmq_store_wal_sync_seconds_count") >= 1
    assert metric(broker.metrics_port, "txmq_store_wal_synced_writes_total") >= 2


def test_a_commit_and_a_query_of_it_are_answered_only_after_the_sync(held) -> None:
    cluster, hold, release = held
    broker = cluster.brokers[0]
    writes_at_hold: list[float] = []

    class Commit(txmq.TransactionListener):
        def execute_local_transaction(self, message, arg):
            # Between the half message (synced and acknowledged) and the commit.
            writes_at_hold.append(metric(broker.metrics_port, "txmq_store_writes_total"))
            hold()
            return txmq.LocalTransactionState.COMMIT

        def check_local_transaction(self, message):
            return txmq.LocalTransactionState.COMMIT

    with txmq.TransactionProducer(cluster.nameserver_address, producer_group="pg", listener=Commit(),
                                  send_timeout_seconds=30) as producer:
        committing, result = _in_thread(lambda: producer.send_in_transaction(txmq.Message("durable", b"t")))
        wait_until(lambda: writes_at_hold and metric(broker.metrics_port, "txmq_store_writes_total") > writes_at_hold[0],
                   10, message="the broker never applied the commit")
        # An operator listing reads the transaction's new state: it is held too.
        listing, listed = _in_thread(lambda: cluster.admin_stub().ListTransactions(
            admin_pb2.ListTransactionsRequest(producer_group="pg"), timeout=30))
        assert not result and not listed
        release()
        committing.join(30)
        listing.join(30)
    assert result and result[0].state is txmq.TransactionState.COMMITTED, result
    response = listed[0]
    assert not response.unreachable_brokers, response
    assert [t.state for t in response.transactions] == [common_pb2.TRANSACTION_STATE_COMMITTED]


def test_requests_that_arrive_during_a_held_sync_leave_together_in_one_stream_message(held, monkeypatch) -> None:
    """The producer keeps one Produce stream message in flight: what arrives meanwhile is
    held by the client and sent as one message once it is answered."""
    monkeypatch.setattr(txmq._pipeline, "HOLD_SECONDS", 60.0)  # never stop holding in this test
    cluster, hold, release = held
    broker = cluster.brokers[0]
    port = broker.metrics_port
    stream_in = {"direction": "in"}
    with txmq.Producer(cluster.nameserver_address, send_timeout_seconds=30) as producer:
        producer.send(txmq.Message("durable", b"warm-up"))  # opens the stream
        messages = metric(port, "txmq_produce_stream_messages_total", stream_in)
        entries = metric(port, "txmq_produce_entries_total")
        session = producer._client.produce_stream(broker.address)._session
        hold()
        first, first_box = _in_thread(lambda: producer.send(txmq.Message("durable", b"first")))
        wait_until(lambda: metric(port, "txmq_produce_stream_messages_total", stream_in) == messages + 1, 10,
                   message="the first send never reached the broker")
        others = []
        for i in range(8):
            others.append(_in_thread(lambda i=i: producer.send(txmq.Message("durable", b"other-%d" % i))))
            # Each is queued on its own, with time to leave alone if nothing held it.
            wait_until(lambda i=i: len(session.pending) == i + 2, 10, message="a send was never queued")
        assert metric(port, "txmq_produce_stream_messages_total", stream_in) == messages + 1
        release()
        for thread, _box in [(first, first_box), *others]:
            thread.join(30)
    assert all(isinstance(box[0], txmq.SendReceipt) for _thread, box in [(first, first_box), *others])
    # Nine sends, two stream messages: the first alone, the eight held ones together.
    assert metric(port, "txmq_produce_stream_messages_total", stream_in) == messages + 2
    assert metric(port, "txmq_produce_entries_total") == entries + 9


def test_a_dead_sync_helper_stops_the_broker_and_a_restart_keeps_what_was_acknowledged(fresh_cluster_factory) -> None:
    cluster = fresh_cluster_factory()
    cluster.create_topic("durable", queue_count=1)
    broker = cluster.brokers[0]
    with txmq.Producer(cluster.nameserver_address) as producer:
        receipts = [producer.send(txmq.Message("durable", b"m%d" % i)) for i in range(20)]
    _sync_helper(broker.pid).kill()
    # The broker must not go on acknowledging writes it can no longer sync: it exits.
    wait_until(lambda: broker.returncode is not None, 15, message="the broker outlived its sync helper")
    assert broker.returncode == 70
    broker.restart()
    cluster.wait_brokers_registered()
    with txmq.SimpleConsumer(cluster.nameserver_address, consumer_group="after", subscriptions={"durable": "*"},
                             await_duration_seconds=2) as consumer:
        got: list[bytes] = []
        wait_until(lambda: got.extend(m.body for m in consumer.receive(max_messages=32)) or len(got) >= 20, 15)
    assert sorted(got) == sorted(b"m%d" % i for i in range(20))
    assert len(receipts) == 20
