"""The continuous audit: ``python -m txmq_pipeline.audit --follow``.

A Structured Streaming query reads every committed message of the audited topics through
the ``txmq`` source (from the earliest retained offset, without bodies). Each micro-batch

1. stores the batch's messages (topic, broker, queue, offset, ids) under
   ``<checkpoint>/seen/batch=<id>``, overwriting that batch's directory: Spark re-runs a
   batch that was planned but not committed before a crash with the same id and the same
   offsets, so a restart never stores a message twice;
2. reconciles everything stored so far with a fresh read of the transaction tables and
   rewrites ``<output>/tables/anomalies`` (Parquet) and ``<output>/summary.json``;
3. sets the Prometheus gauges ``txmq_audit_anomalies{kind}`` and friends.

Between batches (a quiet topic makes none) the reconciliation runs again every
``--interval-seconds``, so a transaction left pending shows up without new messages.

"Committed but missing from the topic" needs care while messages stream in: a
transaction committed after the current batch was planned has its message in a later
batch. A committed transaction counts as missing when its queue offset is below the
highest offset read from its queue, or when it was committed more than
``--missing-grace-seconds`` ago. "In a topic, not committed" ignores messages retention has
since deleted (their transaction rows go with them).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from . import _broker
from .audit import ANOMALY_KINDS, anomalies, of_topics, read_transactions

log = logging.getLogger(__name__)

SEEN_COLUMNS = ("topic", "broker", "queue", "offset", "message_id", "transaction_id", "producer_group")


class AuditMetrics:
    """The follower's Prometheus metrics (one process: the default registry)."""

    def __init__(self) -> None:
        from prometheus_client import Counter, Gauge

        self.anomalies = Gauge("txmq_audit_anomalies", "Anomalies the continuous audit sees now, by kind",
                               ["kind"])
        for kind in ANOMALY_KINDS:
            self.anomalies.labels(kind=kind).set(0)
        self.messages = Gauge("txmq_audit_messages", "Messages (topic offsets) the continuous audit has read")
        self.transactions = Gauge("txmq_audit_transactions", "Transactions in the last reconciliation")
        self.batches = Counter("txmq_audit_batches", "Micro-batches this process reconciled")
        self.last_batch = Gauge("txmq_audit_last_batch_id", "Id of the last micro-batch reconciled")
        self.evaluated = Gauge("txmq_audit_last_reconciliation_timestamp_seconds",
                               "When the anomaly tables were last brought up to date")
        self.seconds = Gauge("txmq_audit_reconciliation_seconds", "How long the last reconciliation took")


class Follower:
    def __init__(self, spark: SparkSession, *, nameserver: str, output: str, checkpoint: str, topics: str,
                 pending_threshold_seconds: float, missing_grace_seconds: float, metrics: AuditMetrics) -> None:
        self.spark, self.nameserver, self.output, self.topics = spark, nameserver, output, topics
        self.seen_dir = os.path.join(checkpoint, "seen")
        self.threshold, self.grace = pending_threshold_seconds, missing_grace_seconds
        self.metrics = metrics
        self.lock = threading.Lock()
        self.last_batch: int | None = None
        self.last_evaluated = 0.0

    # ------------------------------------------------------------------ per micro-batch
    def batch(self, df: DataFrame, batch_id: int) -> None:
        with self.lock:
            path = os.path.join(self.seen_dir, f"batch={batch_id:012d}")
            df.select(*SEEN_COLUMNS).write.mode("overwrite").parquet(path)
            self.last_batch = batch_id
            self.metrics.batches.inc()
            self.metrics.last_batch.set(batch_id)
            self._evaluate()

    def refresh(self) -> None:
        with self.lock:
            self._evaluate()

    # ------------------------------------------------------------------ reconciliation
    def _seen(self) -> DataFrame | None:
        if not os.path.isdir(self.seen_dir):
            return None
        if not any(os.path.exists(os.path.join(self.seen_dir, d, "_SUCCESS")) for d in os.listdir(self.seen_dir)):
            return None
        return self.spark.read.parquet(self.seen_dir).select(*SEEN_COLUMNS)

    def _retained(self) -> DataFrame:
        """(topic, broker, queue, low): the oldest offset each queue still holds."""
        client = _broker.connect(self.nameserver)
        try:
            rows = []
            for topic in sorted({r[0] for r in self._topics_seen()}):
                try:
                    found = _broker.queue_offsets(client, topic)
                except _broker.TxmqError:
                    continue
                rows += [(topic, broker, queue, low) for (broker, queue), (_a, low, _h) in found.items()]
        finally:
            client.close()
        return self.spark.createDataFrame(rows, "topic STRING, broker STRING, queue INT, low BIGINT")

    def _topics_seen(self) -> list[tuple[str]]:
        seen = self._seen()
        return [] if seen is None else [(r.topic,) for r in seen.select("topic").distinct().collect()]

    def _evaluate(self) -> None:
        started = time.monotonic()
        now_ms = int(time.time() * 1000)
        seen = self._seen()
        if seen is None:
            seen = self.spark.createDataFrame([], "topic STRING, broker STRING, queue INT, offset BIGINT, "
                                                  "message_id STRING, transaction_id STRING, producer_group STRING")
        txns = of_topics(read_transactions(self.spark, self.nameserver), self.topics).cache()
        seen = seen.cache()
        try:
            reached = seen.groupBy("topic", "broker", "queue").agg((F.max("offset") + 1).alias("reached"))
            retained = seen.join(self._retained(), ["topic", "broker", "queue"], "left") \
                .filter(F.col("low").isNull() | (F.col("offset") >= F.col("low"))).drop("low")
            found = anomalies(txns, seen, now_ms, self.threshold, in_topic_messages=retained,
                              missing_unless=(reached, now_ms - int(self.grace * 1000)))
            tables = os.path.join(self.output, "tables", "anomalies")
            found.write.mode("overwrite").parquet(tables)
            found = self.spark.read.parquet(tables)
            counts = {kind: 0 for kind in ANOMALY_KINDS}
            counts.update({r["kind"]: r["count"] for r in found.groupBy("kind").count().collect()})
            messages, transactions = seen.count(), txns.count()
        finally:
            txns.unpersist()
            seen.unpersist()
        for kind, n in counts.items():
            self.metrics.anomalies.labels(kind=kind).set(n)
        self.metrics.messages.set(messages)
        self.metrics.transactions.set(transactions)
        self.metrics.evaluated.set(time.time())
        self.metrics.seconds.set(time.monotonic() - started)
        self.last_evaluated = time.monotonic()
        summary = {"evaluated_at_ms": now_ms, "nameserver": self.nameserver, "last_batch_id": self.last_batch,
                   "messages": messages, "transactions": transactions, "anomaly_counts": counts,
                   "anomalies": sum(counts.values())}
        tmp = os.path.join(self.output, "summary.json.tmp")
        with open(tmp, "w") as f:
            json.dump(summary, f, indent=2, sort_keys=True)
        os.replace(tmp, os.path.join(self.output, "summary.json"))
        log.info("batch %s: %d messages, %d transactions, anomalies %s (%.1f s)", self.last_batch, messages,
                 transactions, {k: v for k, v in counts.items() if v} or "none", time.monotonic() - started)


def follow(spark: SparkSession, *, nameserver: str, output: str, checkpoint: str, topics: str = "*",
           pending_threshold_seconds: float, missing_grace_seconds: float = 60.0, interval_seconds: float = 30.0,
           metrics_port: int | None = None, max_offsets_per_trigger: int | None = None,
           stop: threading.Event | None = None) -> int:
    """Runs the continuous audit until ``stop`` is set (SIGTERM/SIGINT from ``main``) or
    the query fails (then raises)."""
    if "://" in output or "://" in checkpoint:
        raise ValueError("--follow writes its tables and checkpoint on local (or mounted) paths")
    os.makedirs(output, exist_ok=True)
    metrics = AuditMetrics()
    if metrics_port is not None:
        from prometheus_client import start_http_server

        start_http_server(metrics_port)
        log.info("metrics on :%d/metrics", metrics_port)
    follower = Follower(spark, nameserver=nameserver, output=output, checkpoint=checkpoint, topics=topics,
                        pending_threshold_seconds=pending_threshold_seconds,
                        missing_grace_seconds=missing_grace_seconds, metrics=metrics)
    reader = (spark.readStream.format("txmq").option("nameserver", nameserver).option("topics", topics)
              .option("startingOffsets", "earliest").option("includeBody", "false"))
    if max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(max_offsets_per_trigger))
    query = (reader.load().select(*SEEN_COLUMNS).writeStream.queryName("txmq-audit-follow")
             .foreachBatch(follower.batch).option("checkpointLocation", os.path.join(checkpoint, "stream"))
             .trigger(processingTime=f"{max(interval_seconds, 0.1)} seconds").start())
    log.info("following %s on %s: tables in %s, checkpoint %s", topics, nameserver, output, checkpoint)
    stop = stop or threading.Event()
    try:
        while not stop.is_set():
            if query.awaitTermination(interval_seconds):
                break  # ended (awaitTermination raised if it failed)
            if time.monotonic() - follower.last_evaluated >= interval_seconds:
                follower.refresh()
    finally:
        if query.isActive:
            query.stop()
    exc = query.exception()
    if exc is not None:
        raise exc
    return 0


def stop_on_signals() -> threading.Event:
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return stop


__all__ = ["AuditMetrics", "Follower", "follow", "stop_on_signals"]
