"""The ``txmq`` source where spark-sql-kafka users expect it to behave the same: a stream
starts at ``latest`` unless told ``earliest``, ``maxOffsetsPerTrigger`` bounds a
micro-batch, ``failOnDataLoss`` fails a query whose unread offsets retention deleted, a
topic pattern, and unknown options refused with the valid ones listed."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.errors import StreamingQueryException

import txmq
from tests.support.waiting import wait_until
from txmq.v1 import broker_pb2, broker_pb2_grpc

from .conftest import PIPELINE_BROKER_ENV


def _send(cluster, topic: str, n: int, prefix: str = "m") -> list[str]:
    with txmq.Producer(cluster.nameserver_address) as p:
        return [p.send(txmq.Message(topic, f"{prefix}-{i}".encode())).message_id for i in range(n)]


def _stream(spark, cluster, topic: str, out: Path, checkpoint: Path, **options: str):
    reader = spark.readStream.format("txmq").option("nameserver", cluster.nameserver_address).option("topic", topic)
    for key, value in options.items():
        reader = reader.option(key, value)
    query = (reader.load().select("message_id").writeStream.format("parquet").option("path", str(out))
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    try:
        query.awaitTermination(120)
    except StreamingQueryException:
        pass  # the caller looks at query.exception()
    return query


def _ids(spark, out: Path) -> list[str]:
    return sorted(r.message_id for r in spark.read.parquet(str(out)).collect()) if out.exists() else []


def test_stream_starts_at_latest_by_default_and_at_earliest_when_asked(spark, txmq_cluster, unique_name, tmp_path):
    cluster, topic = txmq_cluster, unique_name("latest")
    cluster.create_topic(topic, 2)
    before = _send(cluster, topic, 5, "before")

    q = _stream(spark, cluster, topic, tmp_path / "latest", tmp_path / "ck-latest")
    assert q.exception() is None and _ids(spark, tmp_path / "latest") == []  # the backlog is not read
    after = _send(cluster, topic, 3, "after")
    q = _stream(spark, cluster, topic, tmp_path / "latest", tmp_path / "ck-latest")  # resumes
    assert q.exception() is None and _ids(spark, tmp_path / "latest") == sorted(after)

    q = _stream(spark, cluster, topic, tmp_path / "earliest", tmp_path / "ck-earliest", startingOffsets="earliest")
    assert q.exception() is None and _ids(spark, tmp_path / "earliest") == sorted(before + after)


def test_max_offsets_per_trigger_bounds_every_micro_batch(spark, txmq_cluster, unique_name, tmp_path):
    cluster, topic = txmq_cluster, unique_name("limit")
    cluster.create_topic(topic, 2)
    sent = _send(cluster, topic, 11)
    q = _stream(spark, cluster, topic, tmp_path / "out", tmp_path / "ck", startingOffsets="earliest",
                maxOffsetsPerTrigger="3")
    assert q.exception() is None
    sizes = [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]]
    assert sizes == [3, 3, 3, 2], sizes
    assert _ids(spark, tmp_path / "out") == sorted(sent)  # every message once


def test_topic_pattern_reads_the_matching_topics(spark, txmq_cluster, unique_name):
    cluster = txmq_cluster
    prefix = unique_name("pat")
    for name in ("a", "b", "other"):
        cluster.create_topic(f"{prefix}-{name}" if name != "other" else f"x{prefix}", 1)
    expected = _send(cluster, f"{prefix}-a", 2) + _send(cluster, f"{prefix}-b", 3)
    _send(cluster, f"x{prefix}", 4)
    df = (spark.read.format("txmq").option("nameserver", cluster.nameserver_address)
          .option("topicPattern", f"{prefix}-.*").load())
    assert sorted(r.message_id for r in df.collect()) == sorted(expected)


@pytest.mark.parametrize("option, fragment", [
    ("startingOffset", "'startingoffset'"),  # Spark hands options over lower-cased
    ("subscribePattern", "txmq's is 'topicPattern'"),
])
def test_an_unknown_option_is_refused_with_the_valid_ones(spark, txmq_cluster, unique_name, option, fragment):
    cluster, topic = txmq_cluster, unique_name("opts")
    cluster.create_topic(topic, 1)
    with pytest.raises(Exception) as raised:
        (spark.read.format("txmq").option("nameserver", cluster.nameserver_address).option("topic", topic)
         .option(option, "earliest").load().collect())
    text = str(raised.value)
    assert fragment in text and "valid: nameserver" in text and "startingOffsets" in text, text[-2000:]


def test_fail_on_data_loss_when_retention_deleted_unread_offsets(spark, fresh_cluster_factory, unique_name,
                                                                  tmp_path):
    cluster = fresh_cluster_factory(brokers=1, checker=False, broker_env={
        **PIPELINE_BROKER_ENV, "TXMQ_RETENTION_SECONDS": "1.0", "TXMQ_RETENTION_INTERVAL_SECONDS": "0.2"})
    topic = unique_name("loss")
    cluster.create_topic(topic, 1)
    _send(cluster, topic, 3, "first")
    q = _stream(spark, cluster, topic, tmp_path / "out", tmp_path / "ck", startingOffsets="earliest")
    assert q.exception() is None
    _send(cluster, topic, 4, "unread")  # offsets 3..6, never read by the query (6, the newest, stays)

    stub = broker_pb2_grpc.BrokerServiceStub(cluster.channel(cluster.broker(0).address))
    wait_until(lambda: stub.GetQueueOffsets(broker_pb2.GetQueueOffsetsRequest(topic=topic), timeout=5)
               .queues[0].min_offset >= 5, 30, message="retention did not delete the unread messages")

    q = _stream(spark, cluster, topic, tmp_path / "out", tmp_path / "ck")
    assert q.exception() is not None and "failOnDataLoss" in str(q.exception()), q.exception()
    q = _stream(spark, cluster, topic, tmp_path / "out", tmp_path / "ck", failOnDataLoss="false")
    assert q.exception() is None  # skipped to the oldest retained offset
