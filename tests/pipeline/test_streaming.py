"""Streaming through the ``txmq`` data source: a read that resumes from its checkpoint
(no gap, no duplicate, new queues picked up) and the transactional sink (a failed batch is
rolled back and never appears, its re-run commits each row exactly once; a batch re-run
after a crash between the sink's commit and Spark's commit log is deduplicated)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pyspark.sql import functions as F
from pyspark.sql.types import StringType

import txmq
from tests.support.waiting import wait_until
from txmq.ids import TransactionId
from txmq.v1 import admin_pb2, common_pb2
from txmq_pipeline import SinkCheckResponder
from txmq_pipeline.sink import PROP_EPOCH, SinkLog

from .helpers import producer, Scripted, send_workload, transactions


def _read_all(spark, cluster, topic):
    return (spark.read.format("txmq").option("nameserver", cluster.nameserver_address).option("topic", topic)
            .load())


def _stream_to_parquet(spark, cluster, topic, out: Path, checkpoint: Path) -> None:
    query = (spark.readStream.format("txmq").option("nameserver", cluster.nameserver_address)
             .option("topic", topic).option("startingOffsets", "earliest").load()
             .select("broker", "queue", "offset", "message_id", "body")
             .writeStream.format("parquet").option("path", str(out)).option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert query.exception() is None
    assert not query.isActive


def test_streaming_read_resumes_from_the_checkpoint(spark, txmq_cluster, unique_name, tmp_path):
    cluster = txmq_cluster
    topic, group = unique_name("stream"), unique_name("g")
    cluster.create_topic(topic, 2)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    with producer(cluster, group, Scripted()) as p:
        first = send_workload(p, topic, {"commit": 10, "rollback": 3})["commit"]
        _stream_to_parquet(spark, cluster, topic, out, checkpoint)
        assert sorted(r.message_id for r in spark.read.parquet(str(out)).collect()) \
            == sorted(r.message_id for r in first)
        # More messages, and the topic grows: two more queues (one per broker).
        second = send_workload(p, topic, {"commit": 10})["commit"]
        cluster.admin_stub().CreateTopic(admin_pb2.CreateTopicRequest(topic=topic, queue_count=4), timeout=10)
        cluster.wait_route(topic, 4)
        p._client.invalidate_route(topic)
        third = send_workload(p, topic, {"commit": 12, "rollback": 2})["commit"]
    assert any(r.queue_id == 1 for r in third)  # some landed on the new queues
    _stream_to_parquet(spark, cluster, topic, out, checkpoint)  # the same checkpoint: resumes

    rows = spark.read.parquet(str(out)).collect()
    expected = sorted(r.message_id for r in first + second + third)
    assert sorted(r.message_id for r in rows) == expected  # no gap, no duplicate
    assert len({(r.broker, r.queue, r.offset) for r in rows}) == len(rows)
    assert {(r.broker, r.queue) for r in rows} == {(q.broker_name, q.queue_id) for q in cluster.query_route(topic)}


# ---------------------------------------------------------------------------------- the sink

def _sink_query(spark, cluster, source_topic, sink_topic, group, checkpoint: Path, marker: Path):
    """source topic → sink topic. While ``marker`` does not exist, the task holding the
    ``fail-*`` row fails the batch, once the other task has written half messages (it
    waits for the sink group's first transaction, so the abort has something to undo)."""
    marker_path, nameserver = str(marker), cluster.nameserver_address

    def guard(body):
        if body.startswith("fail") and not os.path.exists(marker_path):
            import grpc
            from txmq.v1 import admin_pb2, admin_pb2_grpc
            from tests.support.waiting import wait_until
            with grpc.insecure_channel(nameserver) as channel:
                stub = admin_pb2_grpc.AdminServiceStub(channel)
                wait_until(lambda: stub.ListTransactions(admin_pb2.ListTransactionsRequest(
                    producer_group=group, limit=1), timeout=5).transactions, 30, interval=0.05,
                    message="the other task wrote nothing")
            raise RuntimeError("forced failure of this batch")
        return body

    checked = F.udf(guard, StringType())
    source = (spark.readStream.format("txmq").option("nameserver", cluster.nameserver_address)
              .option("topic", source_topic).option("startingOffsets", "earliest").load())
    return (source.select(F.col("message_id").alias("key"), checked(F.col("body").cast("string")).alias("body"),
                          F.lit("from-stream").alias("tag"),
                          F.create_map(F.lit("source_offset"), F.col("offset").cast("string")).alias("properties"))
            .writeStream.format("txmq").option("nameserver", cluster.nameserver_address)
            .option("topic", sink_topic).option("producerGroup", group)
            .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())


def _source_rows(cluster, topic) -> list[str]:
    """Sends 40 normal messages spread over the topic's queues, then one ``fail-1`` row:
    the task that reads its queue fails the batch while the other writes."""
    bodies = [f"row-{i}" for i in range(40)] + ["fail-1"]
    with txmq.Producer(cluster.nameserver_address) as p:
        for body in bodies:
            p.send(txmq.Message(topic, body.encode()))
    return bodies


def test_sink_failed_batch_is_rolled_back_and_its_retry_commits_each_row_once(spark, txmq_cluster, unique_name,
                                                                              tmp_path):
    cluster = txmq_cluster
    source_topic, sink_topic, group = unique_name("src"), unique_name("sink"), unique_name("sink-g")
    cluster.create_topic(source_topic, 2)
    cluster.create_topic(sink_topic, 4)
    bodies = _source_rows(cluster, source_topic)
    checkpoint, marker = tmp_path / "checkpoint", tmp_path / "marker"

    with SinkCheckResponder(nameserver=cluster.nameserver_address, producer_group=group,
                            checkpoint_location=str(checkpoint), checker_refresh_seconds=0.5) as responder:
        wait_until(lambda: responder.connected_checkers(), 15, message="responder not subscribed")
        # 1. Batch 0 fails: its tasks' half messages are rolled back (abort, or checks).
        failed = _sink_query(spark, cluster, source_topic, sink_topic, group, checkpoint, marker)
        with pytest.raises(Exception, match="forced failure"):
            failed.awaitTermination(120)
        log = SinkLog(str(checkpoint))
        assert log.aborted(0, 0) and log.epoch() == 1 and log.committed_epoch(0) is None
        written = wait_until(lambda: transactions(cluster, group), 15, message="the failed batch wrote nothing")

        # 2. The query restarts from its checkpoint: batch 0 again, now with epoch 1.
        marker.write_text("")
        retried = _sink_query(spark, cluster, source_topic, sink_topic, group, checkpoint, marker)
        retried.awaitTermination(120)
        assert retried.exception() is None
        assert log.committed_epoch(0) == 1

        # Every transaction of the sink's group ends decided: nothing pending, nothing discarded.
        def decided():
            rows = transactions(cluster, group)
            return rows if all(t.state in (common_pb2.TRANSACTION_STATE_COMMITTED,
                                           common_pb2.TRANSACTION_STATE_ROLLED_BACK) for t in rows) else None
        rows = wait_until(decided, 30, interval=0.2, message=lambda: f"sink transactions undecided: "
                          f"{[common_pb2.TransactionState.Name(t.state) for t in transactions(cluster, group)]}")

    out = _read_all(spark, cluster, sink_topic).collect()
    assert sorted(r.body.decode() for r in out) == sorted(bodies)  # each row exactly once
    assert {r.properties[PROP_EPOCH] for r in out} == {"1"}  # nothing of the aborted batch
    assert all(r.tag == "from-stream" and r.properties["source_offset"].isdigit() for r in out)
    committed = sum(1 for t in rows if t.state == common_pb2.TRANSACTION_STATE_COMMITTED)
    rolled_back = sum(1 for t in rows if t.state == common_pb2.TRANSACTION_STATE_ROLLED_BACK)
    assert committed == len(bodies) and rolled_back >= 1 and len(written) >= 1


def test_sink_batch_rerun_after_a_crash_before_the_commit_log_is_deduplicated(spark, txmq_cluster, unique_name,
                                                                               tmp_path):
    cluster = txmq_cluster
    source_topic, sink_topic, group = unique_name("src"), unique_name("sink"), unique_name("sink-g")
    cluster.create_topic(source_topic, 2)
    cluster.create_topic(sink_topic, 2)
    with txmq.Producer(cluster.nameserver_address) as p:
        for i in range(30):
            p.send(txmq.Message(source_topic, f"row-{i}".encode()))
    checkpoint, marker = tmp_path / "checkpoint", tmp_path / "marker"
    marker.write_text("")
    with SinkCheckResponder(nameserver=cluster.nameserver_address, producer_group=group,
                            checkpoint_location=str(checkpoint), checker_refresh_seconds=0.5):
        q = _sink_query(spark, cluster, source_topic, sink_topic, group, checkpoint, marker)
        q.awaitTermination(120)
        assert q.exception() is None
        # The driver "crashed" after the sink committed batch 0 but before Spark recorded it.
        (checkpoint / "commits" / "0").unlink()
        (checkpoint / "commits" / ".0.crc").unlink(missing_ok=True)
        again = _sink_query(spark, cluster, source_topic, sink_topic, group, checkpoint, marker)
        again.awaitTermination(120)
        assert again.exception() is None
        assert (checkpoint / "commits" / "0").exists()
    out = _read_all(spark, cluster, sink_topic).collect()
    assert sorted(r.body.decode() for r in out) == sorted(f"row-{i}" for i in range(30))
    rows = transactions(cluster, group)
    assert len(rows) == 30 and all(t.state == common_pb2.TRANSACTION_STATE_COMMITTED for t in rows)


# ------------------------------------------------------------------- a shard failing mid-write

@pytest.mark.timeout(300)
def test_sink_write_survives_a_shard_killed_mid_write_and_delivers_every_row_once(spark, fresh_cluster_factory,
                                                                                   unique_name, tmp_path):
    """A batch of 400 rows trickles into the sink (20 ms per row, 20 rows per batch handed
    to the writer); broker-1 is SIGKILLed once it stored some of them and stays down
    until the query is done: later rows whose queue was on broker-1 go to broker-0, the
    batch commits (the EndTransactions broker-1 cannot take are left to the check), and
    once broker-1 is back every row is delivered exactly once."""
    from .conftest import PIPELINE_BROKER_ENV, PIPELINE_CHECKER_ENV

    cluster = fresh_cluster_factory(brokers=2, checker=True, broker_env=PIPELINE_BROKER_ENV,
                                    checker_env=PIPELINE_CHECKER_ENV,
                                    nameserver_env={"TXMQ_BROKER_EXPIRY_SECONDS": "1.5"})
    sink_topic, group = unique_name("sink"), unique_name("sink-g")
    cluster.create_topic(sink_topic, 4)
    source, checkpoint = tmp_path / "source", tmp_path / "checkpoint"
    source.mkdir()
    bodies = [f"row-{i}" for i in range(400)]
    (source / "rows.txt").write_text("\n".join(bodies) + "\n")
    nameserver = cluster.nameserver_address

    def slowly(body):
        import time
        time.sleep(0.02)
        return body

    def on_broker_1() -> list[common_pb2.Transaction]:
        return [t for t in transactions(cluster, group) if TransactionId.decode(t.transaction_id).broker == "broker-1"]

    trickle = F.udf(slowly, StringType())
    batch_rows = spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch")
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "20")
    try:
        with SinkCheckResponder(nameserver=nameserver, producer_group=group, checkpoint_location=str(checkpoint),
                                checker_refresh_seconds=0.5) as responder:
            wait_until(lambda: responder.connected_checkers(), 15, message="responder not subscribed")
            query = (spark.readStream.text(str(source)).select(trickle(F.col("value")).alias("body"))
                     .writeStream.format("txmq").option("nameserver", nameserver).option("topic", sink_topic)
                     .option("producerGroup", group).option("checkpointLocation", str(checkpoint))
                     .trigger(availableNow=True).start())
            stored_before = len(wait_until(on_broker_1, 60, interval=0.02, message="the sink stored nothing on broker-1"))
            cluster.kill_broker(1)
            query.awaitTermination(180)
            assert query.exception() is None, query.exception()
            log = SinkLog(str(checkpoint))
            assert log.committed_epoch(0) == 0

            cluster.restart_broker(1)

            def decided():
                rows = transactions(cluster, group)
                return rows if len(rows) >= len(bodies) and all(
                    t.state in (common_pb2.TRANSACTION_STATE_COMMITTED, common_pb2.TRANSACTION_STATE_ROLLED_BACK)
                    for t in rows) else None
            rows = wait_until(decided, 60, interval=0.2, message=lambda: "sink transactions undecided: "
                              f"{[common_pb2.TransactionState.Name(t.state) for t in transactions(cluster, group)]}")
    finally:
        spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", batch_rows)

    out = _read_all(spark, cluster, sink_topic).collect()
    assert sorted(r.body.decode() for r in out) == sorted(bodies)  # each row exactly once
    committed = [t for t in rows if t.state == common_pb2.TRANSACTION_STATE_COMMITTED]
    shards = [TransactionId.decode(t.transaction_id).broker for t in committed]
    print(f"\n{stored_before} stored on broker-1 before it was killed; committed per shard: "
          f"broker-0 {shards.count('broker-0')}, broker-1 {shards.count('broker-1')}")
    assert len(committed) == len(bodies)
    # Rows broker-1 stored before it died were committed by the check once it was back.
    assert any(s == "broker-1" and t.resolution_source == common_pb2.TRANSACTION_SOURCE_CHECK
               for s, t in zip(shards, committed))
