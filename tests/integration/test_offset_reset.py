"""Resetting a consumer group's offsets (issue 32, item 1) against real processes: the
targets (earliest, latest, a time, offsets, a shift) with a dry run first; the refusal
while the group has live consumers, and ``--force``; in-flight receipts invalidated; the
principal recorded; FIFO order from the new position; and under load — a producer
sending all along, a consumer running while a forced reset moves it back, one restarted
after a reset — nothing before the new position delivered again, nothing after it
skipped. The replicated (RF3) case is in test_offset_reset_replicated below."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import threading
import time

import pytest

import txmq
import txmq.errors
from tests.support.cli import txmq_cli
from tests.support.waiting import wait_until
from txmq.v1 import admin_pb2, common_pb2

#: Receivers are live this long after their last receive (the brokers' setting here).
SESSION_SECONDS = 1.5


@pytest.fixture
def reset_cluster(fresh_cluster_factory):
    return fresh_cluster_factory(broker_env={"TXMQ_CONSUMER_SESSION_SECONDS": str(SESSION_SECONDS)})


def consumer(cluster, group: str, topic: str, wait: float = 0.3) -> txmq.SimpleConsumer:
    return txmq.SimpleConsumer(cluster.nameserver_address, consumer_group=group, subscriptions={topic: "*"},
                               await_duration_seconds=wait)


def drain(cluster, group: str, topic: str, count: int) -> list[txmq.ReceivedMessage]:
    """Receives and acknowledges until ``count`` messages came (then the consumer stops)."""
    got: list[txmq.ReceivedMessage] = []
    with consumer(cluster, group, topic) as c:
        def step() -> bool:
            for m in c.receive(max_messages=64):
                got.append(m)
                c.ack(m)
            return len(got) >= count
        wait_until(step, 60, message=lambda: f"received {len(got)} of {count}")
    return got


def wait_not_live(cluster, group: str, topic: str) -> None:
    """Until the brokers no longer count a stopped consumer of the group as live."""
    with txmq.Admin(cluster.nameserver_address) as admin:
        wait_until(lambda: not admin.reset_offsets(group, topic, to_latest=True).live_consumers,
                   SESSION_SECONDS * 20, message="the stopped consumer stays live")


def send(cluster, topic: str, bodies: list[bytes], **fields) -> list[txmq.SendReceipt]:
    with txmq.Producer(cluster.nameserver_address) as p:
        return [p.send(txmq.Message(topic, b, **fields)) for b in bodies]


def test_every_target_dry_run_first_then_executed(reset_cluster, unique_name) -> None:
    cluster = reset_cluster
    topic, group = unique_name("reset"), unique_name("g")
    cluster.create_topic(topic, queue_count=1)
    first = send(cluster, topic, [f"a{i}".encode() for i in range(5)])
    time.sleep(0.05)  # a strictly later visibility time for the second batch (the broker's clock, ms)
    mark = dt.datetime.now(tz=dt.UTC)
    time.sleep(0.05)
    second = send(cluster, topic, [f"b{i}".encode() for i in range(5)])
    assert [r.queue_offset for r in first + second] == list(range(10))
    drain(cluster, group, topic, 10)  # acknowledged up to 10
    wait_not_live(cluster, group, topic)
    with txmq.Admin(cluster.nameserver_address) as admin:
        dry = admin.reset_offsets(group, topic, to_time=mark)
        assert not dry.applied and [(q.current_offset, q.new_offset, q.lag_before, q.lag_after)
                                    for q in dry.queues] == [(10, 5, 0, 5)]
        assert [m.body for m in drain_now(cluster, group, topic)] == []  # a dry run changed nothing
        wait_not_live(cluster, group, topic)
        with pytest.raises(txmq.InvalidFieldError, match="operator"):
            admin.reset_offsets(group, topic, to_time=mark, dry_run=False)
        done = admin.reset_offsets(group, topic, to_time=mark, dry_run=False, operator="alice",
                                   reason="replay after the bad deploy")
        assert done.applied and done.operator == "alice" and done.queues[0].new_offset == 5
        assert [m.body for m in drain(cluster, group, topic, 5)] == [f"b{i}".encode() for i in range(5)]
        wait_not_live(cluster, group, topic)
        for kwargs, expected in [({"to_latest": True}, 10), ({"shift": -3}, 7), ({"to_offsets": {0: 2}}, 2),
                                 ({"to_offsets": {0: 99}}, 10), ({"shift": -99}, 0), ({"to_earliest": True}, 0),
                                 ({"to_latest": True}, 10)]:
            result = admin.reset_offsets(group, topic, dry_run=False, operator="alice", **kwargs)
            assert result.queues[0].new_offset == expected, kwargs
        # Where it stands is what group describe shows, with who reset it last.
        status = admin.consumer_groups(group, topic=topic).queues[0]
        assert status.ack_offset == 10 and status.last_reset_operator == "alice"
        assert status.last_reset_target == "latest" and status.last_reset_at_ms > 0
        for bad, field in [({}, "target"), ({"to_earliest": True, "shift": 1}, "target"),
                           ({"to_offsets": {0: -1}}, "to_offsets"),
                           ({"to_time": dt.datetime(2026, 1, 1)}, "to_time")]:
            with pytest.raises(txmq.InvalidFieldError) as refused:
                admin.reset_offsets(group, topic, dry_run=False, operator="alice", **bad)
            assert refused.value.field == field
        with pytest.raises(txmq.QueueNotFoundError):
            admin.reset_offsets(group, topic, to_offsets={5: 0}, dry_run=False, operator="alice")
        with pytest.raises(txmq.TopicNotFoundError):
            admin.reset_offsets(group, unique_name("none"), to_latest=True)


def drain_now(cluster, group: str, topic: str) -> list[txmq.ReceivedMessage]:
    with consumer(cluster, group, topic, wait=0.2) as c:
        got = c.receive(max_messages=64)
        for m in got:
            c.ack(m)
        return got


def test_refused_while_consumers_are_live_unless_forced_and_receipts_in_flight_die(reset_cluster,
                                                                                   unique_name) -> None:
    cluster = reset_cluster
    topic, group = unique_name("live"), unique_name("g")
    cluster.create_topic(topic, queue_count=1)
    send(cluster, topic, [f"m{i}".encode() for i in range(4)])
    with consumer(cluster, group, topic) as c, txmq.Admin(cluster.nameserver_address) as admin:
        held = c.receive(max_messages=2)  # in flight, unacknowledged
        assert [m.queue_offset for m in held] == [0, 1]
        dry = admin.reset_offsets(group, topic, to_earliest=True)
        assert len(dry.live_consumers) == 1 and dry.queues[0].inflight_invalidated == 2
        with pytest.raises(txmq.ConsumersLiveError, match="live consumer"):
            admin.reset_offsets(group, topic, to_earliest=True, dry_run=False, operator="bob")
        done = admin.reset_offsets(group, topic, to_earliest=True, dry_run=False, force=True, operator="bob")
        assert done.applied and done.queues[0].inflight_invalidated == 2
        for m in held:  # a receipt from before the reset acknowledges nothing now
            with pytest.raises(txmq.ReceiptHandleNotFoundError):
                c.ack(m)
        again = []

        def step() -> bool:
            for m in c.receive(max_messages=8):
                again.append(m)
                c.ack(m)
            return len(again) >= 4
        wait_until(step, 30)
        assert [m.queue_offset for m in again] == [0, 1, 2, 3]
        # The revoked deliveries' attempts count on: a new receipt never equals an old one.
        assert [m.delivery_attempt for m in again] == [2, 2, 1, 1]
        assert {m.receipt_handle for m in again}.isdisjoint({m.receipt_handle for m in held})


def test_cli_dry_run_prints_current_new_and_lag_change(reset_cluster, unique_name) -> None:
    cluster = reset_cluster
    topic, group = unique_name("cli"), unique_name("g")
    cluster.create_topic(topic, queue_count=2)
    send(cluster, topic, [f"m{i}".encode() for i in range(6)])
    drain(cluster, group, topic, 6)
    wait_not_live(cluster, group, topic)
    done = txmq_cli(cluster, "group", "reset", group, "--topic", topic, "--shift", "-1")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["applied"] is False and len(data["queues"]) == 2
    assert all(q["new_offset"] == q["current_offset"] - 1 and q["lag_change"] == 1 for q in data["queues"])
    assert not any(q["clamped"] for q in data["queues"])
    # An offset past the queue's end is clamped, and the text says so.
    done = txmq_cli(cluster, "group", "reset", group, "--topic", topic, "--to-offset", "0:1000")
    [queue0] = json.loads(done.stdout)["queues"]
    assert queue0["clamped"] and queue0["asked_offset"] == 1000 and queue0["new_offset"] == queue0["max_offset"]
    text = subprocess.run([sys.executable, "-m", "txmq", "--nameserver", cluster.nameserver_address, "group", "reset",
                           group, "--topic", topic, "--to-offset", "0:1000"], capture_output=True, text=True,
                          timeout=120)
    assert f"broker-0/0: asked 1000, the queue holds 0..{queue0['max_offset']}: NEW is {queue0['max_offset']}" \
        in text.stdout, text.stdout
    done = txmq_cli(cluster, "group", "reset", group, "--topic", topic, "--to-offset", "0:0", "--execute",
                    "--operator", "carol", "--reason", "replay queue 0")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["applied"] is True and data["operator"] == "carol"
    assert [(q["queue_id"], q["new_offset"]) for q in data["queues"]] == [(0, 0)]
    described = json.loads(txmq_cli(cluster, "group", "describe", group, "--topic", topic).stdout)
    queue0 = next(q for q in described["queues"] if q["queue_id"] == 0)
    assert queue0["ack_offset"] == 0 and queue0["last_reset"]["operator"] == "carol"
    assert queue0["last_reset"]["reason"] == "replay queue 0"
    text = subprocess.run([sys.executable, "-m", "txmq", "--nameserver", cluster.nameserver_address, "group",
                           "describe", group, "--topic", topic], capture_output=True, text=True, timeout=120)
    [line] = [line for line in text.stdout.splitlines() if line.startswith("last reset")]
    assert line.endswith("by carol (to offset): replay queue 0"), text.stdout  # one broker: recorded once
    done = txmq_cli(cluster, "group", "reset", group, "--topic", topic, "--to-time", "yesterday-ish")
    assert done.returncode == 1 and json.loads(done.stderr)["error"]["field"] == "to_time"
    done = txmq_cli(cluster, "group", "reset", group, "--topic", topic)
    assert done.returncode == 2 and json.loads(done.stderr)["error"]["code"] == "USAGE"


def test_fifo_groups_keep_their_order_from_the_new_position(reset_cluster, unique_name) -> None:
    cluster = reset_cluster
    topic, group = unique_name("fifo"), unique_name("g")
    cluster.admin_stub().CreateTopic(admin_pb2.CreateTopicRequest(
        topic=topic, queue_count=1, topic_type=common_pb2.TOPIC_TYPE_FIFO), timeout=10)
    cluster.wait_route(topic, 1)
    bodies = [f"{g}-{i}".encode() for i in range(4) for g in ("x", "y")]  # interleaved groups
    with txmq.Producer(cluster.nameserver_address) as p:
        for b in bodies:
            p.send(txmq.Message(topic, b, message_group=b.decode()[0]))
    with consumer(cluster, group, topic) as c, txmq.Admin(cluster.nameserver_address) as admin:
        held = c.receive(max_messages=8)  # the first of each group, in flight
        assert sorted(m.body for m in held) == [b"x-0", b"y-0"]
        admin.reset_offsets(group, topic, to_offsets={0: 2}, dry_run=False, force=True, operator="dave")
        seen: dict[str, list[int]] = {"x": [], "y": []}

        # Acknowledge each delivery before the next receive: one at a time per group.
        def one_round() -> bool:
            got = c.receive(max_messages=8)
            for m in got:
                g = m.message_group
                assert all(v < int(m.body.decode().split("-")[1]) for v in seen[g]), "out of order"
                seen[g].append(int(m.body.decode().split("-")[1]))
            groups = [m.message_group for m in got]
            assert len(groups) == len(set(groups)), f"two of one group in one receive: {groups}"
            for m in got:
                c.ack(m)
            return sum(len(v) for v in seen.values()) >= 6

        wait_until(one_round, 30, message=lambda: f"seen {seen}")
        assert seen == {"x": [1, 2, 3], "y": [1, 2, 3]}  # from offset 2 (x-1), each group in order


class Running:
    """A consumer on a thread that records, for every message it receives, whether the
    receive began after ``barrier`` was set (the reset returned), and acknowledges it (an
    ack of a delivery made before a reset fails: it was revoked). ``acked_after`` holds the
    messages whose ack succeeded and began once ``resetting`` was set (the reset was asked
    for): a delivery made after the reset is acknowledged while the reset's answer is still
    on its way back too, so counting only acks begun after ``barrier`` would miss those."""

    def __init__(self, cluster, group: str, topic: str) -> None:
        self.barrier = threading.Event()
        self.resetting = threading.Event()
        self.after: list[txmq.ReceivedMessage] = []
        self.before: list[txmq.ReceivedMessage] = []
        self.acked_after: set[tuple[int, int]] = set()
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._consumer = consumer(cluster, group, topic, wait=0.2)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            began_after = self.barrier.is_set()
            try:
                got = self._consumer.receive(max_messages=16, invisible_duration_seconds=30)
            except txmq.TxmqError as exc:
                if not exc.retryable:
                    self.errors.append(exc)
                continue
            (self.after if began_after else self.before).extend(got)
            acked_after_reset = self.resetting.is_set()
            for m, error in zip(got, self._consumer.ack_many(got)):
                # A delivery made before the reset was revoked: its ack fails. So an ack that
                # succeeds once the reset is done is of a delivery made after it (whenever
                # the receive that brought it began). One begun while the reset was being
                # made may be of a delivery before it, acknowledged before the reset landed:
                # its offset is then at or above the group's offset, so at or above the new
                # position (the check below that nothing before it came again stays exact);
                # such a message must come again too, which only the few acknowledged in that
                # window are not asked to show.
                if error is None and acked_after_reset:
                    self.acked_after.add((m.queue_id, m.queue_offset))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        self._consumer.close()


@pytest.mark.heavy  # a producer sending at full speed beside the consumer
def test_under_load_nothing_before_the_new_position_again_nothing_after_it_skipped(reset_cluster,
                                                                                  unique_name) -> None:
    cluster = reset_cluster
    topic, group = unique_name("load"), unique_name("g")
    queues = 2
    cluster.create_topic(topic, queue_count=queues)
    sent: list[txmq.SendReceipt] = []
    stop_sending = threading.Event()

    def produce() -> None:
        with txmq.Producer(cluster.nameserver_address) as p:
            i = 0
            while not stop_sending.is_set():
                sent.append(p.send(txmq.Message(topic, f"m{i}".encode())))
                i += 1

    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    running = Running(cluster, group, topic)
    try:
        wait_until(lambda: len(running.before) >= 200, 60, message="the running consumer received too little")
        with txmq.Admin(cluster.nameserver_address) as admin:
            plan = admin.reset_offsets(group, topic, shift=-50)
            assert plan.live_consumers  # it is running
            running.resetting.set()
            done = admin.reset_offsets(group, topic, shift=-50, dry_run=False, force=True, operator="load-test")
            running.barrier.set()
        new = {q.queue_id: q.new_offset for q in done.queues}
        wait_until(lambda: len(sent) >= 2 * len(running.before) or len(running.after) >= 300, 60)
        stop_sending.set()
        producer.join(30)
        ends: dict[int, int] = {}
        for r in sent:
            ends[r.queue_id] = max(ends.get(r.queue_id, 0), r.queue_offset + 1)
        wanted = {(q, o) for q in range(queues) for o in range(new[q], ends.get(q, 0))}
        wait_until(lambda: wanted <= running.acked_after, 90,
                   message=lambda: f"{len(wanted - running.acked_after)} offsets at or after the new position "
                                   f"{new} never acknowledged after the reset, first "
                                   f"{sorted(wanted - running.acked_after)[:5]}")
    finally:
        stop_sending.set()
        running.stop()
    assert not running.errors, running.errors
    early = sorted({(m.queue_id, m.queue_offset) for m in running.after if m.queue_offset < new[m.queue_id]}
                   | {(q, o) for q, o in running.acked_after if o < new[q]})
    assert early == [], f"delivered again from before the new position: {early[:10]}"


def test_a_consumer_restarted_after_a_reset_starts_at_the_new_position(reset_cluster, unique_name) -> None:
    cluster = reset_cluster
    topic, group = unique_name("restart"), unique_name("g")
    cluster.create_topic(topic, queue_count=2)
    receipts = send(cluster, topic, [f"m{i}".encode() for i in range(40)])
    drain(cluster, group, topic, 40)
    wait_not_live(cluster, group, topic)
    with txmq.Admin(cluster.nameserver_address) as admin:
        done = admin.reset_offsets(group, topic, shift=-7, dry_run=False, operator="eve")
    new = {q.queue_id: q.new_offset for q in done.queues}
    expected = {(r.queue_id, r.queue_offset) for r in receipts if r.queue_offset >= new[r.queue_id]}
    got = drain(cluster, group, topic, len(expected))
    assert {(m.queue_id, m.queue_offset) for m in got} == expected
    assert len(got) == len(expected)  # each once
    assert drain_now(cluster, group, topic) == []


@pytest.mark.timeout(240)
def test_a_reset_on_a_replicated_shard_survives_the_leader(fresh_cluster_factory, unique_name) -> None:
    """RF3: the reset is one replicated write; the next leader serves the group from the new
    position (and finds the messages by key: the key index is replicated too)."""
    from tests.support import replicas

    cluster = fresh_cluster_factory(brokers=1, replication_factor=3,
                                    broker_env={"TXMQ_CONSUMER_SESSION_SECONDS": str(SESSION_SECONDS)})
    topic, group = unique_name("rf3"), unique_name("g")
    cluster.create_topic(topic, 2)
    receipts = send(cluster, topic, [f"m{i}".encode() for i in range(30)], keys=("batch-7",))
    drain(cluster, group, topic, 30)
    wait_not_live(cluster, group, topic)
    with txmq.Admin(cluster.nameserver_address) as admin:
        done = admin.reset_offsets(group, topic, shift=-5, dry_run=False, operator="frank")
    new = {q.queue_id: q.new_offset for q in done.queues}
    replicas.wait_in_sync(cluster, "broker-0")
    old = cluster.wait_leaders()["broker-0"]
    old.kill()
    cluster.wait_leaders(not_on=old)
    expected = {(r.queue_id, r.queue_offset) for r in receipts if r.queue_offset >= new[r.queue_id]}
    got = drain(cluster, group, topic, len(expected))
    assert {(m.queue_id, m.queue_offset) for m in got} == expected
    with txmq.Admin(cluster.nameserver_address) as admin:
        found = wait_until(lambda: admin.find_messages(topic, "batch-7", limit=100), 30,
                           ignore=(txmq.TxmqError,))
        assert len(found.messages) == 30
        status = {q.queue_id: q for q in admin.consumer_groups(group, topic=topic).queues}
        assert {q.last_reset_operator for q in status.values()} == {"frank"}
    old.restart(60)
    replicas.stop_and_compare(cluster, "broker-0")
