"""Batch reads through the ``txmq`` data source against real brokers: exactly the
committed messages (never a half or rolled-back one) with their offsets and fields, offset
and time bounds, pushed-down filters, and the transaction table."""

from __future__ import annotations

import json
import time

from pyspark.sql import functions as F

from tests.support.waiting import wait_until

from .helpers import committed_offsets, producer, Scripted, send_workload, wait_settled

OUTCOMES = {"commit": 12, "rollback": 6, "pending": 3}


def test_batch_read_returns_exactly_the_committed_messages(spark, txmq_cluster, unique_name):
    cluster = txmq_cluster
    topic, group = unique_name("read"), unique_name("g")
    cluster.create_topic(topic, 4)
    started_ms = int(time.time() * 1000)
    with producer(cluster, group, Scripted()) as p:
        results = send_workload(p, topic, OUTCOMES)
    wait_settled(cluster, group, sum(OUTCOMES.values()), pending=OUTCOMES["pending"])
    expected = committed_offsets(cluster, results["commit"])
    by_message = {r.message_id: r for r in results["commit"]}

    df = spark.read.format("txmq").option("nameserver", cluster.nameserver_address).option("topic", topic).load()
    rows = df.withColumn("born_ms", F.unix_millis("born_at")).withColumn("stored_ms", F.unix_millis("stored_at")) \
             .withColumn("committed_ms", F.unix_millis("committed_at")).collect()

    assert df.rdd.getNumPartitions() == 4  # one per (broker, queue)
    assert sorted(r.message_id for r in rows) == sorted(expected)  # no half, no rolled-back message
    for r in rows:
        sent = by_message[r.message_id]
        assert (r.broker, r.queue, r.offset) == expected[r.message_id]
        assert r.topic == topic and r.transaction_id == sent.transaction_id and r.producer_group == group
        i = int(r.properties["i"])
        assert r.body == f"commit-{i}".encode() and r.tag == "commit" and r.keys == [f"key-{i}"]
        assert r.properties == {"outcome": "commit", "i": str(i)}
        assert started_ms - 1000 <= r.born_ms <= r.stored_ms <= r.committed_ms <= int(time.time() * 1000)
    # Offsets are dense per queue in commit order.
    for (broker, queue) in {(b, q) for b, q, _ in expected.values()}:
        offsets = sorted(o for b, q, o in expected.values() if (b, q) == (broker, queue))
        assert offsets == list(range(len(offsets)))


def test_offset_and_time_bounds_and_pushed_filters(spark, txmq_cluster, unique_name):
    cluster = txmq_cluster
    topic, group = unique_name("bounds"), unique_name("g")
    cluster.create_topic(topic, 2)
    with producer(cluster, group, Scripted()) as p:
        first = send_workload(p, topic, {"commit": 8})["commit"]
        middle_ms = int(time.time() * 1000) + 1
        wait_until(lambda: time.time() * 1000 > middle_ms, 2, interval=0.001, message="clock stuck")
        second = send_workload(p, topic, {"commit": 8})["commit"]
    offsets = committed_offsets(cluster, first + second)

    def reader():  # DataFrameReader.option() mutates the reader: a new one per read
        return spark.read.format("txmq").option("nameserver", cluster.nameserver_address).option("topic", topic)

    after = reader().option("startTime", str(middle_ms)).load().select("message_id").collect()
    assert sorted(r.message_id for r in after) == sorted(r.message_id for r in second)
    before = reader().option("endTime", str(middle_ms)).load().select("message_id").collect()
    assert sorted(r.message_id for r in before) == sorted(r.message_id for r in first)

    broker, queue, _ = next(iter(offsets.values()))
    bounded = reader().option("startingOffsets", json.dumps({topic: {broker: {str(queue): 2}}})) \
                    .option("endingOffsets", json.dumps({topic: {broker: {str(queue): 5}}})) \
                    .option("brokers", broker).option("queues", str(queue)).load().collect()
    assert sorted(r.offset for r in bounded) == [2, 3, 4]
    assert {(r.broker, r.queue) for r in bounded} == {(broker, queue)}

    pushed = reader().option("pushFilters", "true").load() \
                   .filter((F.col("broker") == broker) & (F.col("queue") == queue) & (F.col("offset") >= 3))
    assert pushed.rdd.getNumPartitions() == 1  # the other queues were pruned at planning
    want = sorted(o for b, q, o in offsets.values() if (b, q) == (broker, queue) and o >= 3)
    assert sorted(r.offset for r in pushed.collect()) == want


def test_transaction_table(spark, txmq_cluster, unique_name):
    cluster = txmq_cluster
    topic, group = unique_name("txns"), unique_name("g")
    cluster.create_topic(topic, 2)
    with producer(cluster, group, Scripted()) as p:
        results = send_workload(p, topic, {"commit": 5, "rollback": 3, "check-commit": 2, "pending": 1})
        wait_settled(cluster, group, 11, pending=1)  # the producer answers the checks meanwhile
    df = (spark.read.format("txmq").option("nameserver", cluster.nameserver_address)
          .option("table", "transactions").option("transactionPartitionsPerBroker", "3").load()
          .filter(F.col("producer_group") == group))
    rows = {r.transaction_id: r for r in df.collect()}
    assert len(rows) == 11
    for outcome, state, source in (("commit", "COMMITTED", "CLIENT"), ("rollback", "ROLLED_BACK", "CLIENT"),
                                   ("check-commit", "COMMITTED", "CHECK"), ("pending", "PREPARED", None)):
        for r in results[outcome]:
            row = rows[r.transaction_id]
            assert (row.state, row.resolution_source, row.topic) == (state, source, topic)
            assert row.message_id == r.message_id and row.prepared_at is not None
            assert (row.ended_at is None) == (state == "PREPARED")
            assert (row.queue_offset is not None) == (state == "COMMITTED")
    assert all(rows[r.transaction_id].checks_answered >= 1 for r in results["check-commit"])


def test_delay_messages_carry_their_delivery_time(spark, txmq_cluster, unique_name):
    """A delay / timer message is read once it is visible, with its delivery time in
    ``deliver_at`` (null for other messages) and ``committed_at`` not before it."""
    import txmq

    cluster = txmq_cluster
    topic = unique_name("delayed")
    cluster.create_topic(topic, 1)
    with txmq.Producer(cluster.nameserver_address) as p:
        due_ms = int(time.time() * 1000) + 500
        p.send(txmq.Message(topic, b"timed", delay_seconds=0.5))
        p.send(txmq.Message(topic, b"plain"))

    def read():
        return spark.read.format("txmq").option("nameserver", cluster.nameserver_address) \
            .option("topic", topic).load() \
            .withColumn("deliver_ms", F.unix_millis("deliver_at")) \
            .withColumn("committed_ms", F.unix_millis("committed_at")).collect()
    def both():
        rows = read()
        return rows if len(rows) == 2 else None
    rows = wait_until(both, 30, interval=0.5, message="the timed message never became visible")
    by_body = {r.body: r for r in rows}
    assert by_body[b"plain"].deliver_at is None
    timed = by_body[b"timed"]
    assert due_ms <= timed.deliver_ms <= due_ms + 1000
    assert timed.committed_ms >= timed.deliver_ms


def test_fifo_messages_carry_their_message_group(spark, txmq_cluster, unique_name):
    """A FIFO topic's messages are read with their ``message_group`` (null on a normal
    topic), each group's messages in one queue in send order."""
    import txmq
    from txmq.v1 import admin_pb2, common_pb2

    cluster = txmq_cluster
    fifo, plain = unique_name("fifo"), unique_name("plain")
    cluster.admin_stub().CreateTopic(admin_pb2.CreateTopicRequest(
        topic=fifo, queue_count=2, topic_type=common_pb2.TOPIC_TYPE_FIFO), timeout=10)
    cluster.wait_route(fifo, 2)
    cluster.create_topic(plain, 1)
    with txmq.Producer(cluster.nameserver_address) as p:
        for i in range(3):
            for g in ("a", "b"):
                p.send(txmq.Message(fifo, f"{g}{i}".encode(), message_group=g))
        p.send(txmq.Message(plain, b"plain"))
    rows = spark.read.format("txmq").option("nameserver", cluster.nameserver_address) \
        .option("topics", f"{fifo},{plain}").load().orderBy("offset").collect()
    by_group: dict = {}
    for r in rows:
        by_group.setdefault(r.message_group, []).append(r)
    assert [r.body for r in by_group.pop(None)] == [b"plain"]
    assert {g: [r.body for r in rs] for g, rs in by_group.items()} == {
        "a": [b"a0", b"a1", b"a2"], "b": [b"b0", b"b1", b"b2"]}
    assert all(len({r.queue for r in rs}) == 1 for rs in by_group.values())
