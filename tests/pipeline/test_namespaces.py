"""The Spark connector's ``namespace`` option: reads (``topic``, ``*``, ``topicPattern``)
and the transactional sink see one namespace's topics alone, another namespace's topic of
the same name never."""

from __future__ import annotations

import uuid

import pytest

import txmq
from txmq_pipeline import SinkCheckResponder
from tests.support.waiting import wait_until


def _read(spark, cluster, namespace, **options):
    reader = spark.read.format("txmq").option("nameserver", cluster.nameserver_address)
    for k, v in {"namespace": namespace, **options}.items():
        reader = reader.option(k, v)
    return reader.load()


def test_a_namespace_scopes_reads_and_the_sink(spark, txmq_cluster, tmp_path):
    cluster = txmq_cluster
    run = uuid.uuid4().hex[:8]
    a, b = f"sa{run}", f"sb{run}"
    for ns, count in ((a, 5), (b, 3)):
        with txmq.Admin(cluster.nameserver_address, namespace=ns) as admin:
            admin.create_topic("events", queue_count=2)
            admin.create_topic("copy", queue_count=2)
        for topic in ("events", "copy"):
            cluster.wait_route(f"{ns}%{topic}", 2, 15)
        with txmq.Producer(cluster.nameserver_address, namespace=ns) as p:
            for i in range(count):
                p.send(txmq.Message("events", f"{ns}-{i}".encode()))
    expected = {a: sorted(f"{a}-{i}" for i in range(5)), b: sorted(f"{b}-{i}" for i in range(3))}

    rows = _read(spark, cluster, a, topic="events").collect()
    assert sorted(r.body.decode() for r in rows) == expected[a]
    assert {r.topic for r in rows} == {f"{a}%events"}
    everything = _read(spark, cluster, b, topics="*").collect()
    assert sorted(r.body.decode() for r in everything) == expected[b]
    matched = _read(spark, cluster, a, topicPattern="ev.*").collect()
    assert sorted(r.body.decode() for r in matched) == expected[a]

    # A stream from a's events into b's copy through the transactional sink of b's group.
    checkpoint = tmp_path / "checkpoint"
    with SinkCheckResponder(nameserver=cluster.nameserver_address, producer_group="copier", namespace=b,
                            checkpoint_location=str(checkpoint), checker_refresh_seconds=0.5) as responder:
        wait_until(lambda: responder.connected_checkers(), 15, message="responder not subscribed")
        query = (spark.readStream.format("txmq").option("nameserver", cluster.nameserver_address)
                 .option("namespace", a).option("topic", "events").option("startingOffsets", "earliest").load()
                 .select("body").writeStream.format("txmq").option("nameserver", cluster.nameserver_address)
                 .option("namespace", b).option("topic", "copy").option("producerGroup", "copier")
                 .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
        query.awaitTermination(120)
        assert query.exception() is None
    copied = _read(spark, cluster, b, topic="copy").collect()
    assert sorted(r.body.decode() for r in copied) == expected[a]
    assert {r.producer_group for r in copied} == {f"{b}%copier"}
    assert _read(spark, cluster, a, topic="copy").collect() == []


def test_a_bad_namespace_or_a_smuggled_one_is_refused(spark, txmq_cluster):
    with pytest.raises(Exception, match="namespace"):
        _read(spark, txmq_cluster, "bad ns", topic="events").collect()
    with pytest.raises(Exception, match="cannot name a namespace"):
        _read(spark, txmq_cluster, "blue", topic="green%events").collect()
