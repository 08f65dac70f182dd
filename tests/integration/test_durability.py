"""flush=sync over real processes: nothing is answered before the WAL holding it (and
everything it read) is synced, and a failed sync stops the broker without losing
anything acknowledged.

The broker syncs RocksDB's WAL with fdatasync on its event loop. These tests load a
fault injector into the broker (tests/support/holdsync.c, LD_PRELOAD) that holds or fails
fdatasync(2) and fsync(2) on request, as a slow or broken disk would: the broker's own
code runs unchanged."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

import txmq
import txmq._produce_stream
from tests.support import holdsync
from tests.support.holdsync import SyncGate
from tests.support.metrics import metric
from tests.support.waiting import wait_until
from txmq.v1 import admin_pb2, common_pb2


@pytest.fixture(scope="session")
def sync_gate_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return holdsync.build(tmp_path_factory.mktemp("holdsync"))


@pytest.fixture
def gated(fresh_cluster_factory, sync_gate_library, tmp_path, monkeypatch) -> Iterator[tuple[Any, SyncGate]]:
    """A one-broker cluster whose processes load the sync gate, and a topic."""
    gate = SyncGate(sync_gate_library, tmp_path / "gate")
    gate.install(monkeypatch)
    cluster = fresh_cluster_factory()
    cluster.create_topic("durable", queue_count=1)
    try:
        yield cluster, gate
    finally:
        gate.release()
        gate.heal()


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


def _wal_count(cluster: Any, needle: bytes) -> int:
    """How often ``needle`` occurs in the broker's write-ahead logs (written, synced or not)."""
    data_dir = Path(cluster.brokers[0].env["TXMQ_DATA_DIR"])
    return sum(path.read_bytes().count(needle) for path in data_dir.glob("*.log"))


def test_a_send_and_a_receive_are_answered_only_after_the_sync(gated) -> None:
    cluster, gate = gated
    broker = cluster.brokers[0]
    body = b"held-" + uuid.uuid4().hex.encode()
    with txmq.Producer(cluster.nameserver_address, send_timeout_seconds=30) as producer, \
            txmq.SimpleConsumer(cluster.nameserver_address, consumer_group="g", subscriptions={"durable": "*"},
                                await_duration_seconds=20) as consumer:
        producer.send(txmq.Message("durable", b"before"))
        assert [m.body for m in consumer.receive(max_messages=8)] == [b"before"]
        syncs = metric(broker.metrics_port, "txmq_store_wal_syncs_total")
        gate.hold()
        sending, sent = _in_thread(lambda: producer.send(txmq.Message("durable", body)))
        # The broker wrote the message to its WAL and is syncing it ...
        wait_until(gate.holding_wal, 10, message="the broker never synced its WAL")
        assert _wal_count(cluster, body) >= 1
        receiving, received = _in_thread(lambda: consumer.receive(max_messages=8))
        # ... but neither the producer nor a consumer hears of the message before the
        # sync returns.
        sending.join(0.3)
        assert not sent and not received
        gate.release()
        sending.join(30)
        receiving.join(30)
    assert isinstance(sent[0], txmq.SendReceipt), sent
    assert [m.body for m in received[0]] == [body]
    assert metric(broker.metrics_port, "txmq_store_wal_syncs_total") > syncs
    # The held sync is in the latency histogram, and it made the held write durable.
    assert metric(broker.metrics_port, "txmq_store_wal_sync_seconds_count") >= 1
    assert metric(broker.metrics_port, "txmq_store_wal_synced_writes_total") >= 2


def test_a_commit_and_a_query_of_it_are_answered_only_after_the_sync(gated) -> None:
    cluster, gate = gated
    # (message id, how often the WAL names it once the half message is acknowledged)
    half: list[tuple[bytes, int]] = []

    class Commit(txmq.TransactionListener):
        def execute_local_transaction(self, message, arg):
            # Between the half message (synced and acknowledged) and the commit.
            message_id = message.message_id.encode()
            half.append((message_id, _wal_count(cluster, message_id)))
            gate.hold()
            return txmq.LocalTransactionState.COMMIT

        def check_local_transaction(self, message):
            return txmq.LocalTransactionState.COMMIT

    with txmq.TransactionProducer(cluster.nameserver_address, producer_group="pg", listener=Commit(),
                                  send_timeout_seconds=30) as producer:
        committing, result = _in_thread(lambda: producer.send_in_transaction(txmq.Message("durable", b"t")))
        wait_until(lambda: half and gate.holding_wal(), 10, message="the broker never synced the commit")
        # The commit is written (it rewrote the transaction's row, which names the message
        # id) and being synced ...
        message_id, before_commit = half[0]
        assert _wal_count(cluster, message_id) > before_commit
        # ... and an operator listing, which reads the transaction's new state, is held too.
        listing, listed = _in_thread(lambda: cluster.admin_stub().ListTransactions(
            admin_pb2.ListTransactionsRequest(producer_group="pg"), timeout=30))
        committing.join(0.3)
        assert not result and not listed
        gate.release()
        committing.join(30)
        listing.join(30)
    assert result and result[0].state is txmq.TransactionState.COMMITTED, result
    response = listed[0]
    assert not response.unreachable_brokers, response
    assert [t.state for t in response.transactions] == [common_pb2.TRANSACTION_STATE_COMMITTED]


def test_requests_that_arrive_during_a_held_sync_leave_together_in_one_stream_message(gated, monkeypatch) -> None:
    """A caller alone goes direct (a unary call, no stream); callers that arrive while
    another waits take the Produce stream, which keeps one message in flight: what arrives
    meanwhile is held by the client and sent as one message once it is answered."""
    monkeypatch.setattr(txmq._produce_stream, "HOLD_SECONDS", 60.0)  # never stop holding in this test
    monkeypatch.setattr(txmq._produce_stream, "SPLIT_AT", 100)  # one lane: nine callers, one call
    cluster, gate = gated
    broker = cluster.brokers[0]
    port = broker.metrics_port
    stream_in = {"direction": "in"}
    with txmq.Producer(cluster.nameserver_address, send_timeout_seconds=30) as producer:
        stream = producer._client.produce_stream(broker.address)
        messages = metric(port, "txmq_produce_stream_messages_total", stream_in) or 0
        producer.send(txmq.Message("durable", b"warm-up"))  # alone: direct
        assert (metric(port, "txmq_produce_stream_messages_total", stream_in) or 0) == messages
        assert stream._sessions == [None, None]
        entries = metric(port, "txmq_produce_entries_total") or 0
        gate.hold()
        first, first_box = _in_thread(lambda: producer.send(txmq.Message("durable", b"first")))
        wait_until(gate.holding_wal, 10, message="the first send never reached the broker's WAL sync")
        others = []
        for i in range(8):
            others.append(_in_thread(lambda i=i: producer.send(txmq.Message("durable", b"other-%d" % i))))
            # Each is queued on its own, with time to leave alone if nothing held it.
            wait_until(lambda i=i: stream._sessions[0] is not None and len(stream._sessions[0].pending) == i + 1,
                       10, message="a send was never queued")
        gate.release()
        for thread, _box in [(first, first_box), *others]:
            thread.join(30)
    assert all(isinstance(box[0], txmq.SendReceipt) for _thread, box in [(first, first_box), *others])
    # The first direct; eight on the stream in two messages: one alone, the seven held ones together.
    assert metric(port, "txmq_produce_stream_messages_total", stream_in) == messages + 2
    assert metric(port, "txmq_produce_entries_total") == entries + 8


def test_a_failed_sync_stops_the_broker_and_a_restart_keeps_what_was_acknowledged(gated) -> None:
    cluster, gate = gated
    broker = cluster.brokers[0]
    with txmq.Producer(cluster.nameserver_address, send_timeout_seconds=2, max_attempts=1) as producer:
        receipts = [producer.send(txmq.Message("durable", b"m%d" % i)) for i in range(20)]
        gate.fail()
        # The broker must not go on acknowledging writes it can no longer sync: it exits.
        with pytest.raises(txmq.TxmqError):
            producer.send(txmq.Message("durable", b"unsynced"))
    wait_until(lambda: broker.returncode is not None, 15, message="the broker outlived a failed WAL sync")
    assert broker.returncode == 70
    gate.heal()
    broker.restart()
    cluster.wait_brokers_registered()
    with txmq.SimpleConsumer(cluster.nameserver_address, consumer_group="after", subscriptions={"durable": "*"},
                             await_duration_seconds=2) as consumer:
        got: list[bytes] = []
        wait_until(lambda: got.extend(m.body for m in consumer.receive(max_messages=32)) or len(got) >= 20, 15)
    # Every acknowledged message survived; the unacknowledged one may or may not have
    # (it reached the WAL's page cache before the sync failed), never twice.
    assert sorted(b for b in got if b != b"unsynced") == sorted(b"m%d" % i for i in range(20))
    assert got.count(b"unsynced") <= 1
    assert len(receipts) == 20
