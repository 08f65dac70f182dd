"""The audit's analysis as DataFrame functions, shared by the one-off audit (``audit``) and
the continuous one (``follow``): reading the broker's transaction table and the topics'
messages, and computing state counts, latency, checks and the anomalies."""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from txmq.tls import TLS
from txmq_pipeline import _broker

#: Final state → its column in the state counts.
STATES = {"COMMITTED": "committed", "ROLLED_BACK": "rolled_back", "DISCARDED": "discarded", "PREPARED": "pending"}
SOURCES = ("CLIENT", "CHECK", "OPERATOR", "BROKER")
ANOMALY_KINDS = ("committed_missing", "uncommitted_in_topic", "duplicate_message_id",
                 "pending_too_old", "discarded_unresolved")
DEFAULT_PENDING_THRESHOLD_SECONDS = 300.0
#: Example ids per anomaly kind in summary.json and the report (all of them are in Parquet).
EXAMPLES = 50


# ----------------------------------------------------------------------------- inputs

def read_transactions(spark: SparkSession, nameserver: str, partitions_per_broker: int = 4,
                      tls: TLS | None = None) -> DataFrame:
    return (spark.read.format("txmq").option("nameserver", nameserver).options(**_broker.tls_options(tls))
            .option("table", "transactions")
            .option("transactionPartitionsPerBroker", str(partitions_per_broker)).load())


def read_messages(spark: SparkSession, nameserver: str, topics: str = "*",
                  max_messages_per_partition: int = 200_000, tls: TLS | None = None) -> DataFrame:
    return (spark.read.format("txmq").option("nameserver", nameserver).options(**_broker.tls_options(tls))
            .option("topics", topics).option("includeBody", "false")
            .option("maxMessagesPerPartition", str(max_messages_per_partition)).load())


def of_topics(transactions: DataFrame, topics: str) -> DataFrame:
    """The transactions of ``topics`` (``*``: all): with ``--topics orders`` a committed
    transaction of another topic is not "missing" from the topics read."""
    names = [t.strip() for t in topics.split(",") if t.strip()]
    return transactions if names in ([], ["*"]) else transactions.filter(F.col("topic").isin(names))


# ----------------------------------------------------------------------------- transforms

def state_counts(transactions: DataFrame) -> DataFrame:
    """Per (producer_group, topic): counts by final state and by resolution source."""
    txns = transactions.select("producer_group", "topic", "state", "resolution_source")
    by_state = [F.sum(F.when(F.col("state") == s, 1).otherwise(0)).cast("long").alias(c) for s, c in STATES.items()]
    by_source = [F.sum(F.when(F.col("resolution_source") == s, 1).otherwise(0)).cast("long")
                 .alias(f"source_{s.lower()}") for s in SOURCES]
    return (txns.groupBy("producer_group", "topic")
            .agg(F.count(F.lit(1)).alias("total"), *by_state, *by_source)
            .select("producer_group", "topic", "total", *STATES.values(),
                    *(f"source_{s.lower()}" for s in SOURCES)))


def latency(transactions: DataFrame) -> DataFrame:
    """Per (producer_group, topic): time to resolution (prepared → ended, seconds) of the
    transactions committed or rolled back."""
    ended = (transactions
             .select("producer_group", "topic", "state", "prepared_at_ms", "ended_at_ms")
             .filter(F.col("state").isin("COMMITTED", "ROLLED_BACK") & F.col("ended_at_ms").isNotNull())
             .withColumn("seconds", (F.col("ended_at_ms") - F.col("prepared_at_ms")) / F.lit(1000.0)))
    q = F.percentile_approx("seconds", [0.5, 0.9, 0.99], 10000)
    return (ended.groupBy("producer_group", "topic")
            .agg(F.count(F.lit(1)).alias("resolved"), q.alias("q"), F.max("seconds").alias("max_seconds"),
                 F.avg("seconds").alias("mean_seconds"))
            .select("producer_group", "topic", "resolved",
                    F.col("q")[0].alias("p50_seconds"), F.col("q")[1].alias("p90_seconds"),
                    F.col("q")[2].alias("p99_seconds"), "mean_seconds", "max_seconds"))


#: Latency histogram buckets: this many per decade of seconds, from 1 ms (everything
#: faster lands in the first) to 10^5 s.
BUCKETS_PER_DECADE = 4
_FIRST_BUCKET, _LAST_BUCKET = -3 * BUCKETS_PER_DECADE, 5 * BUCKETS_PER_DECADE


def latency_histogram(transactions: DataFrame) -> DataFrame:
    """Per (producer_group, topic, bucket): resolved transactions whose time to resolution
    is at most ``upper_seconds`` (log-spaced buckets, 4 per decade), for a CDF."""
    seconds = (F.col("ended_at_ms") - F.col("prepared_at_ms")) / F.lit(1000.0)
    bucket = F.ceil(F.log10(F.greatest(seconds, F.lit(1e-3))) * BUCKETS_PER_DECADE)
    bucket = F.least(F.greatest(bucket, F.lit(_FIRST_BUCKET)), F.lit(_LAST_BUCKET)).cast("int")
    return (transactions.select("producer_group", "topic", "state", "prepared_at_ms", "ended_at_ms")
            .filter(F.col("state").isin("COMMITTED", "ROLLED_BACK") & F.col("ended_at_ms").isNotNull())
            .groupBy("producer_group", "topic", bucket.alias("bucket"))
            .agg(F.count(F.lit(1)).alias("transactions"))
            .select("producer_group", "topic", "bucket",
                    F.pow(F.lit(10.0), F.col("bucket") / F.lit(float(BUCKETS_PER_DECADE))).alias("upper_seconds"),
                    "transactions"))


def checks_distribution(transactions: DataFrame) -> DataFrame:
    """Per (producer_group, topic, checks delivered): how many transactions."""
    return (transactions.select("producer_group", "topic", "checks_delivered", "checks_answered")
            .groupBy("producer_group", "topic", "checks_delivered")
            .agg(F.count(F.lit(1)).alias("transactions"), F.sum("checks_answered").cast("long").alias("answers"))
            .select("producer_group", "topic", "checks_delivered", "transactions", "answers"))


_ANOMALY_COLUMNS = ("kind", "broker", "producer_group", "topic", "transaction_id", "message_id", "detail")


def anomalies(transactions: DataFrame, messages: DataFrame, now_ms: int,
              pending_threshold_seconds: float, *, in_topic_messages: DataFrame | None = None,
              missing_unless: tuple[DataFrame, int] | None = None) -> DataFrame:
    """One row per anomaly: kind, broker, producer_group, topic, transaction_id, message_id, detail.

    The continuous audit passes ``in_topic_messages`` (the messages still retained, for
    "in a topic, not committed") and ``missing_unless`` = (``progress``: topic, broker,
    queue, ``reached`` offset, ``caught_up``; ``committed_before_ms``): a committed
    transaction is missing only when its offset is below what was read of its queue, or it
    ended before ``committed_before_ms`` and its queue is read to the end — not when its
    message is merely in a batch still to come."""
    txns = transactions.select("transaction_id", "message_id", "broker", "producer_group", "topic", "queue",
                               "state", "prepared_at_ms", "ended_at_ms", "queue_offset", "discard_reason")
    msgs = messages.select("topic", "broker", "queue", "offset", "message_id", "transaction_id", "producer_group")
    in_topics = msgs.filter(F.col("transaction_id").isNotNull()).select("transaction_id").distinct()

    committed = txns.filter(F.col("state") == "COMMITTED")
    if missing_unless is not None:
        progress, committed_before_ms = missing_unless
        committed = (committed.join(progress, on=["topic", "broker", "queue"], how="left")
                     .filter((F.col("queue_offset") < F.coalesce(F.col("reached"), F.lit(0)))
                             | ((F.col("ended_at_ms") < F.lit(committed_before_ms))
                                & F.coalesce(F.col("caught_up"), F.lit(False))))
                     .drop("reached", "caught_up"))
    committed_missing = (committed
                         .join(in_topics, on="transaction_id", how="left_anti")
                         .select(F.lit("committed_missing").alias("kind"), "broker", "producer_group", "topic",
                                 "transaction_id", "message_id",
                                 F.format_string("committed at queue %d offset %s but not in the topic",
                                                 F.col("queue"), F.col("queue_offset")).alias("detail")))

    states = txns.select("transaction_id", F.col("state").alias("txn_state"))
    retained = msgs if in_topic_messages is None else in_topic_messages.select(*msgs.columns)
    uncommitted = (retained.filter(F.col("transaction_id").isNotNull())
                   .join(states, on="transaction_id", how="left")
                   .filter(F.col("txn_state").isNull() | (F.col("txn_state") != "COMMITTED"))
                   .select(F.lit("uncommitted_in_topic").alias("kind"), "broker", "producer_group", "topic",
                           "transaction_id", "message_id",
                           F.format_string("at queue %d offset %d, transaction %s", F.col("queue"), F.col("offset"),
                                           F.coalesce(F.col("txn_state"), F.lit("unknown"))).alias("detail")))

    duplicates = (msgs.groupBy("topic", "message_id")
                  .agg(F.count(F.lit(1)).alias("copies"), F.first("broker").alias("broker"),
                       F.first("producer_group").alias("producer_group"),
                       F.first("transaction_id").alias("transaction_id"),
                       F.array_join(F.sort_array(F.collect_list(F.format_string(
                           "%s/%d@%d", F.col("broker"), F.col("queue"), F.col("offset")))), ", ").alias("where"))
                  .filter(F.col("copies") > 1)
                  .select(F.lit("duplicate_message_id").alias("kind"), "broker", "producer_group", "topic",
                          "transaction_id", "message_id",
                          F.format_string("%d copies: %s", F.col("copies"), F.col("where")).alias("detail")))

    cutoff = now_ms - int(pending_threshold_seconds * 1000)
    pending = (txns.filter((F.col("state") == "PREPARED") & (F.col("prepared_at_ms") < F.lit(cutoff)))
               .select(F.lit("pending_too_old").alias("kind"), "broker", "producer_group", "topic",
                       "transaction_id", "message_id",
                       F.format_string("pending for %.1f s", (F.lit(now_ms) - F.col("prepared_at_ms")) / 1000.0)
                       .alias("detail")))

    discarded = (txns.filter(F.col("state") == "DISCARDED")
                 .select(F.lit("discarded_unresolved").alias("kind"), "broker", "producer_group", "topic",
                         "transaction_id", "message_id",
                         F.coalesce(F.col("discard_reason"), F.lit("")).alias("detail")))

    return (committed_missing.unionByName(uncommitted).unionByName(duplicates).unionByName(pending)
            .unionByName(discarded).select(*_ANOMALY_COLUMNS))
