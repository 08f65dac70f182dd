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
``--interval-seconds``, so a transaction left pending shows up without new messages; also
when the first trigger made no batch (a query started again on its checkpoint with nothing
new to read): it then reconciles what the earlier run stored. The first reconciliation
waits for the stream's first trigger: the ``txmq`` source starts in a Python process of
its own, which Spark gives a fixed 10 s to connect back; a reconciliation beside it (its
Spark jobs start Python processes too) made it miss that on a busy machine and failed the
query. A first trigger that has not run after ``--first-trigger-timeout-seconds`` is
logged, and the reconciliation runs anyway. A query that failed so (its source's process
slower than those 10 s even alone) is started again on its checkpoint after a pause, up
to ``STREAM_START_ATTEMPTS`` times in all. Only batches stored
completely count (Spark wrote ``_SUCCESS``): a write a crash cut short is not read, and
Spark runs that batch again.

"Committed but missing from the topic" needs care while messages stream in: a
transaction committed after the current batch was planned has its message in a later
batch, and at start the stream may be far behind. A committed transaction counts as
missing when its queue offset is below the highest offset read from its queue, or when it
was committed more than ``--missing-grace-seconds`` ago and the stream has read all its
queue held (its recorded offset points nowhere). "In a topic, not committed" ignores messages retention has
since deleted (their transaction rows go with them).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from typing import TYPE_CHECKING

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.errors import StreamingQueryException
from pyspark.sql.streaming import StreamingQuery

from txmq.tls import TLS

from . import _broker
from .analysis import ANOMALY_KINDS, anomalies, of_topics, read_transactions

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

log = logging.getLogger(__name__)

#: How long the follower waits for its stream's first trigger before it reconciles anyway
#: (``--first-trigger-timeout-seconds``).
DEFAULT_FIRST_TRIGGER_TIMEOUT_SECONDS = 300.0

#: How a query fails when its source's Python process (Spark starts one per streaming Python
#: data source, and waits a fixed 10 s for it to connect back: not a setting in Spark 4.3)
#: started too slowly; how often the follower starts the query before giving up, pausing
#: this long times the attempts so far in between, at most STREAM_RESTART_PAUSE_MAX_SECONDS.
#: That process imports PySpark from Spark's pyspark.zip, compiling it (0.85 s of CPU
#: against 0.27 s from site-packages): at a load average of 22 on 2 cores 9-11 s, and three
#: starts in a row missed the 10 s.
SOURCE_NOT_CONNECTED = "Python worker failed to connect back"
STREAM_START_ATTEMPTS = 8
STREAM_RESTART_PAUSE_SECONDS = 5.0
STREAM_RESTART_PAUSE_MAX_SECONDS = 30.0

SEEN_COLUMNS = ("topic", "broker", "queue", "offset", "message_id", "transaction_id", "producer_group")


class AuditMetrics:
    """The follower's Prometheus metrics, in ``registry`` (None: the process's default
    registry, as ``python -m txmq_pipeline.audit --follow`` runs it)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        from prometheus_client import REGISTRY, Counter, Gauge

        self.registry = registry = REGISTRY if registry is None else registry

        self.anomalies = Gauge("txmq_audit_anomalies", "Anomalies the continuous audit sees now, by kind",
                               ["kind"], registry=registry)
        for kind in ANOMALY_KINDS:
            self.anomalies.labels(kind=kind).set(0)
        self.messages = Gauge("txmq_audit_messages", "Messages (topic offsets) the continuous audit has read",
                              registry=registry)
        self.transactions = Gauge("txmq_audit_transactions", "Transactions in the last reconciliation",
                                  registry=registry)
        self.batches = Counter("txmq_audit_batches", "Micro-batches this process reconciled", registry=registry)
        self.last_batch = Gauge("txmq_audit_last_batch_id", "Id of the last micro-batch reconciled",
                                registry=registry)
        self.evaluated = Gauge("txmq_audit_last_reconciliation_timestamp_seconds",
                               "When the anomaly tables were last brought up to date", registry=registry)
        self.seconds = Gauge("txmq_audit_reconciliation_seconds", "How long the last reconciliation took",
                             registry=registry)


class Follower:
    def __init__(self, spark: SparkSession, *, nameserver: str, output: str, checkpoint: str, topics: str,
                 pending_threshold_seconds: float, missing_grace_seconds: float, metrics: AuditMetrics,
                 partitions_per_broker: int = 4, tls: TLS | None = None) -> None:
        self.partitions_per_broker = partitions_per_broker
        self.spark, self.nameserver, self.output, self.topics = spark, nameserver, output, topics
        self.tls = tls
        self.seen_dir = os.path.join(checkpoint, "seen")
        self.threshold, self.grace = pending_threshold_seconds, missing_grace_seconds
        self.metrics = metrics
        self.lock = threading.Lock()
        self.batches_waiting = 0  # a micro-batch waiting for the lock goes before a refresh
        self.last_batch: int | None = None
        self.last_evaluated: float | None = None  # time.monotonic() of the last reconciliation
        self.last_duration = 0.0

    # ------------------------------------------------------------------ per micro-batch
    def batch(self, df: DataFrame, batch_id: int) -> None:
        self.batches_waiting += 1
        with self.lock:
            self.batches_waiting -= 1
            path = os.path.join(self.seen_dir, f"batch={batch_id:012d}")
            df.select(*SEEN_COLUMNS).write.mode("overwrite").parquet(path)
            self.last_batch = batch_id
            self.metrics.batches.inc()
            self.metrics.last_batch.set(batch_id)
            self._evaluate()

    def refresh(self) -> None:
        """Reconciles again (no new messages, but time passes: pending transactions age),
        unless a micro-batch is waiting to do it."""
        with self.lock:
            if not self.batches_waiting:
                self._evaluate()

    # ------------------------------------------------------------------ the query
    def watch(self, query: StreamingQuery, *, interval_seconds: float, stop: threading.Event,
              first_trigger_timeout_seconds: float = DEFAULT_FIRST_TRIGGER_TIMEOUT_SECONDS) -> int:
        """Reconciles while ``query`` (a streaming query whose batches go to :meth:`batch`)
        runs, until ``stop`` is set (then stops it) or it ends (raises if it failed): first
        once its first trigger has run (:meth:`_await_first_trigger`), then every
        ``interval_seconds`` when no batch did."""
        try:
            if self._await_first_trigger(query, interval_seconds, stop, first_trigger_timeout_seconds):
                while not stop.is_set():
                    # Whether or not a batch came (a query resumed with nothing new to read
                    # runs none), and never busier than half the time: a reconciliation
                    # slower than the interval spaces them.
                    last = self.last_evaluated
                    if last is None or time.monotonic() - last >= max(interval_seconds, self.last_duration):
                        self.refresh()
                    if query.awaitTermination(interval_seconds):
                        break  # ended (awaitTermination raised if it failed)
        finally:
            if query.isActive:
                query.stop()
        exc = query.exception()
        if exc is not None:
            raise exc
        return 0

    def _await_first_trigger(self, query: StreamingQuery, interval_seconds: float, stop: threading.Event,
                             timeout_seconds: float) -> bool:
        """Until the query has run its first trigger (its source started, its offsets read,
        the batch they made, if any, reconciled by :meth:`batch`) or ``timeout_seconds``
        passed; False when ``stop`` was set or the query ended first.

        Its source starts in a Python process Spark gives a fixed 10 s to connect back
        (not a setting, in Spark 4.3); a reconciliation started beside it on a busy machine
        (its jobs start Python processes of their own) made it miss that and failed the
        query, so the first reconciliation waits for it."""
        started = time.monotonic()
        log.info("waiting for the stream's first trigger (its source starting) before the first reconciliation")
        poll = min(max(interval_seconds, 0.1), 1.0)
        while query.lastProgress is None:  # reported once the trigger, and its batch if any, ended
            if time.monotonic() - started >= timeout_seconds:
                log.warning("the stream has not run its first trigger in %.0f s (%s): reconciling what is stored "
                            "meanwhile", timeout_seconds, query.status.get("message"))
                return True
            if stop.is_set() or query.awaitTermination(poll):
                return False
        log.info("the stream ran its first trigger in %.1f s", time.monotonic() - started)
        return True

    # ------------------------------------------------------------------ reconciliation
    def _seen(self) -> DataFrame | None:
        """The messages of every batch stored completely (by this run or an earlier one on
        the checkpoint); None before there is one."""
        if not os.path.isdir(self.seen_dir):
            return None
        complete = [os.path.join(self.seen_dir, d) for d in sorted(os.listdir(self.seen_dir))
                    if os.path.exists(os.path.join(self.seen_dir, d, "_SUCCESS"))]
        if not complete:
            return None
        return self.spark.read.option("basePath", self.seen_dir).parquet(*complete).select(*SEEN_COLUMNS)

    def _queues(self) -> DataFrame:
        """(topic, broker, queue, low, high) of every queue of the audited topics now: the
        oldest offset it still holds and its next offset."""
        client = _broker.connect(self.nameserver, self.tls)
        try:
            names = [t.strip() for t in self.topics.split(",") if t.strip()]
            rows = []
            for topic in (_broker.user_topics(client) if names in ([], ["*"]) else names):
                try:
                    found = _broker.queue_offsets(client, topic)
                except _broker.TxmqError:
                    continue
                rows += [(topic, broker, queue, low, high) for (broker, queue), (_a, low, high) in found.items()]
        finally:
            client.close()
        return self.spark.createDataFrame(rows, "topic STRING, broker STRING, queue INT, low BIGINT, high BIGINT")

    def _evaluate(self) -> None:
        started = time.monotonic()
        now_ms = int(time.time() * 1000)
        seen = self._seen()
        if seen is None:
            seen = self.spark.createDataFrame([], "topic STRING, broker STRING, queue INT, offset BIGINT, "
                                                  "message_id STRING, transaction_id STRING, producer_group STRING")
        keys = ["topic", "broker", "queue"]
        log.debug("reconciling: queue offsets")
        queues = self._queues().cache()  # before the transactions: offsets below high are older
        txns = of_topics(read_transactions(self.spark, self.nameserver, self.partitions_per_broker, self.tls),
                         self.topics).cache()
        seen = seen.cache()
        try:
            # How far the stream has read each queue, and whether it has read all it held
            # when this reconciliation began.
            reached = seen.groupBy(*keys).agg((F.max("offset") + 1).alias("reached"))
            progress = (queues.join(reached, keys, "left")
                        .select(*keys, F.coalesce(F.col("reached"), F.lit(0)).alias("reached"),
                                (F.coalesce(F.col("reached"), F.col("low")) >= F.col("high")).alias("caught_up")))
            retained = (seen.join(queues.select(*keys, "low"), keys, "left")
                        .filter(F.col("low").isNull() | (F.col("offset") >= F.col("low"))).drop("low"))
            found = anomalies(txns, seen, now_ms, self.threshold, in_topic_messages=retained,
                              missing_unless=(progress, now_ms - int(self.grace * 1000)))
            tables = os.path.join(self.output, "tables", "anomalies")
            log.debug("reconciling: writing %s (%.1f s in)", tables, time.monotonic() - started)
            found.write.mode("overwrite").parquet(tables)
            log.debug("reconciling: counting (%.1f s in)", time.monotonic() - started)
            found = self.spark.read.parquet(tables)
            counts = {kind: 0 for kind in ANOMALY_KINDS}
            counts.update({r["kind"]: r["count"] for r in found.groupBy("kind").count().collect()})
            messages, transactions = seen.count(), txns.count()
        finally:
            txns.unpersist()
            seen.unpersist()
            queues.unpersist()
        for kind, n in counts.items():
            self.metrics.anomalies.labels(kind=kind).set(n)
        self.metrics.messages.set(messages)
        self.metrics.transactions.set(transactions)
        self.metrics.evaluated.set(time.time())
        self.metrics.seconds.set(time.monotonic() - started)
        self.last_evaluated = time.monotonic()
        self.last_duration = self.last_evaluated - started
        summary = {"evaluated_at_ms": now_ms, "nameserver": self.nameserver, "last_batch_id": self.last_batch,
                   "messages": messages, "transactions": transactions, "anomaly_counts": counts,
                   "anomalies": sum(counts.values())}
        tmp = os.path.join(self.output, "summary.json.tmp")
        with open(tmp, "w") as f:
            json.dump(summary, f, indent=2, sort_keys=True)
        os.replace(tmp, os.path.join(self.output, "summary.json"))
        log.info("%s: %d messages, %d transactions, anomalies %s (%.1f s)",
                 "no batch yet" if self.last_batch is None else f"batch {self.last_batch}", messages,
                 transactions, {k: v for k, v in counts.items() if v} or "none", time.monotonic() - started)


def follow(spark: SparkSession, *, nameserver: str, output: str, checkpoint: str, topics: str = "*",
           pending_threshold_seconds: float, missing_grace_seconds: float = 60.0, interval_seconds: float = 30.0,
           metrics_port: int | None = None, max_offsets_per_trigger: int | None = None,
           partitions_per_broker: int = 4, tls: TLS | None = None, stop: threading.Event | None = None,
           registry: CollectorRegistry | None = None,
           first_trigger_timeout_seconds: float = DEFAULT_FIRST_TRIGGER_TIMEOUT_SECONDS) -> int:
    """Runs the continuous audit until ``stop`` is set (SIGTERM/SIGINT from ``main``) or
    the query fails (then raises). Its metrics go to ``registry`` (None: the process's
    default one), served on ``metrics_port`` until it returns: a caller that follows more
    than once in one process (a test) passes a fresh registry each time."""
    if "://" in output or "://" in checkpoint:
        raise ValueError("--follow writes its tables and checkpoint on local (or mounted) paths")
    os.makedirs(output, exist_ok=True)
    metrics = AuditMetrics(registry)
    follower = Follower(spark, nameserver=nameserver, output=output, checkpoint=checkpoint, topics=topics,
                        pending_threshold_seconds=pending_threshold_seconds,
                        missing_grace_seconds=missing_grace_seconds, metrics=metrics,
                        partitions_per_broker=partitions_per_broker, tls=tls)
    server = None
    if metrics_port is not None:
        from prometheus_client import start_http_server

        server, _thread = start_http_server(metrics_port, registry=metrics.registry)
        log.info("metrics on :%d/metrics", metrics_port)
    try:
        return _run(spark, follower, checkpoint, interval_seconds=interval_seconds,
                    max_offsets_per_trigger=max_offsets_per_trigger, stop=stop or threading.Event(),
                    first_trigger_timeout_seconds=first_trigger_timeout_seconds)
    finally:
        if server is not None:  # the port is free again once follow returns
            server.shutdown()
            server.server_close()


def _run(spark: SparkSession, follower: Follower, checkpoint: str, *, interval_seconds: float,
         max_offsets_per_trigger: int | None, stop: threading.Event, first_trigger_timeout_seconds: float) -> int:
    reader = (spark.readStream.format("txmq").option("nameserver", follower.nameserver)
              .options(**_broker.tls_options(follower.tls))
              .option("topics", follower.topics)
              .option("startingOffsets", "earliest").option("includeBody", "false"))
    if max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(max_offsets_per_trigger))
    attempt = 1
    while True:
        query = (reader.load().select(*SEEN_COLUMNS).writeStream.queryName("txmq-audit-follow")
                 .foreachBatch(follower.batch).option("checkpointLocation", os.path.join(checkpoint, "stream"))
                 .trigger(processingTime=f"{max(interval_seconds, 0.1)} seconds").start())
        log.info("following %s on %s: tables in %s, checkpoint %s", follower.topics, follower.nameserver,
                 follower.output, checkpoint)
        try:
            return follower.watch(query, interval_seconds=interval_seconds, stop=stop,
                                  first_trigger_timeout_seconds=first_trigger_timeout_seconds)
        except StreamingQueryException as exc:
            if SOURCE_NOT_CONNECTED not in str(exc) or attempt >= STREAM_START_ATTEMPTS:
                raise
        # Nothing is lost: the query starts again on its checkpoint, where it stopped. The
        # pause, longer each time, lets a busy spell pass.
        pause = min(STREAM_RESTART_PAUSE_SECONDS * attempt, STREAM_RESTART_PAUSE_MAX_SECONDS)
        attempt += 1
        log.warning("the stream's source did not start: its Python process did not connect back within Spark's "
                    "fixed 10 s (a busy machine); starting the query again on its checkpoint in %.0f s (attempt %d "
                    "of %d)", pause, attempt, STREAM_START_ATTEMPTS)
        if stop.wait(pause):
            return 0


def stop_on_signals() -> threading.Event:
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return stop


__all__ = ["DEFAULT_FIRST_TRIGGER_TIMEOUT_SECONDS", "SEEN_COLUMNS", "AuditMetrics", "Follower", "follow",
           "stop_on_signals"]
