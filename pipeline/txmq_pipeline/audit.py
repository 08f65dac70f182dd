"""The transaction audit: every broker's transaction table reconciled against what its
topics hold — the offline twin of what the checker does online.

Run locally (``local[*]`` unless ``--master``)::

    python -m txmq_pipeline.audit --nameserver ns:9876 --output ./audit-out

or on a cluster (see pipeline/README.md for Kubernetes)::

    spark-submit --master k8s://... .../txmq_pipeline/audit.py --nameserver ... --output s3a://...

A cluster serving TLS (the chart's default) needs ``--tls-ca`` (and ``--tls-cert``/``--tls-key``
where it requires client certificates), or the ``TXMQ_TLS_*`` variables, as the ``txmq`` CLI.

Output (``--output``):

- ``tables/state_counts``, ``tables/latency``, ``tables/latency_histogram``,
  ``tables/checks``, ``tables/anomalies``:
  Parquet, per producer group and topic;
- ``summary.json``: totals, per group/topic figures, anomaly counts and example ids;
- ``report.html`` (self-contained: styles and charts inside) and ``report.md`` with
  ``state_counts.png`` and ``latency.png`` (written where Python can write: a local path,
  the driver's filesystem). The job ends by printing the reports' paths.

Anomalies (each listed with its ids): ``committed_missing`` (a committed transaction whose
message is not in its topic), ``uncommitted_in_topic`` (a message in a topic whose
transaction is not committed, or unknown), ``duplicate_message_id`` (one message id at two
offsets of a topic), ``pending_too_old`` (PREPARED for longer than
``--pending-threshold-seconds``), ``discarded_unresolved`` (DISCARDED and never committed
or rolled back).

Exit status: 0 clean, 2 when any anomaly is found (for scheduled runs), 1 on error.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, NoReturn, Sequence

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from txmq.errors import InvalidFieldError, TxmqError, UnavailableError
from txmq.tls import TLS, add_tls_arguments, tls_from_args
from txmq_pipeline import _broker

from .analysis import (  # noqa: F401 - the audit's API
    ANOMALY_KINDS, BUCKETS_PER_DECADE, DEFAULT_PENDING_THRESHOLD_SECONDS, EXAMPLES, SOURCES, STATES, anomalies,
    checks_distribution, latency, latency_histogram, of_topics, read_messages, read_transactions, state_counts)
from .follow import DEFAULT_FIRST_TRIGGER_TIMEOUT_SECONDS, follow, stop_on_signals

log = logging.getLogger("txmq_pipeline.audit")

EXIT_CLEAN = 0
EXIT_ERROR = 1
EXIT_ANOMALIES = 2


# ----------------------------------------------------------------------------- the job

@dataclass
class AuditResult:
    state_counts: list[dict[str, Any]]
    latency: list[dict[str, Any]]
    checks: list[dict[str, Any]]
    anomaly_counts: dict[str, int]
    anomaly_examples: dict[str, list[dict[str, Any]]]
    transactions: int
    messages: int
    seconds: float
    latency_histogram: list[dict[str, Any]] = field(default_factory=list)
    generated_at_ms: int = 0
    reports: list[str] = field(default_factory=list)
    #: Wall seconds per step: read_transactions, read_messages, tables, report.
    phases: dict[str, float] = field(default_factory=dict)

    @property
    def anomalies(self) -> int:
        return sum(self.anomaly_counts.values())

    @property
    def exit_status(self) -> int:
        return EXIT_ANOMALIES if self.anomalies else EXIT_CLEAN


def _rows(df: DataFrame) -> list[dict[str, Any]]:
    return [r.asDict() for r in df.collect()]


def run(spark: SparkSession, *, nameserver: str, output: str, topics: str = "*",
        pending_threshold_seconds: float = DEFAULT_PENDING_THRESHOLD_SECONDS, report_format: str = "both",
        partitions_per_broker: int = 4, max_messages_per_partition: int = 200_000,
        now_ms: int | None = None, tls: TLS | None = None) -> AuditResult:
    started = time.monotonic()
    now_ms = now_ms if now_ms is not None else int(time.time() * 1000)
    txns = of_topics(read_transactions(spark, nameserver, partitions_per_broker, tls), topics).cache()
    msgs = read_messages(spark, nameserver, topics, max_messages_per_partition, tls).cache()
    phases: dict[str, float] = {}
    mark = time.monotonic()

    def phase(name: str) -> None:
        nonlocal mark
        now = time.monotonic()
        phases[name] = round(now - mark, 3)
        mark = now

    try:
        log.info("reading the transaction tables through %s", nameserver)
        transactions = txns.count()
        phase("read_transactions")
        log.info("%d transactions; reading the messages of topics %s", transactions, topics)
        messages = msgs.count()
        phase("read_messages")
        log.info("%d messages; reconciling", messages)
        tables = {"state_counts": state_counts(txns), "latency": latency(txns),
                  "latency_histogram": latency_histogram(txns), "checks": checks_distribution(txns),
                  "anomalies": anomalies(txns, msgs, now_ms, pending_threshold_seconds)}
        for name, df in tables.items():
            df.write.mode("overwrite").parquet(os.path.join(output, "tables", name))
            log.info("wrote %s", os.path.join(output, "tables", name))
        read_back = {name: spark.read.parquet(os.path.join(output, "tables", name)) for name in tables}
        found = read_back["anomalies"]
        counts = {kind: 0 for kind in ANOMALY_KINDS}
        counts.update({r["kind"]: r["count"] for r in found.groupBy("kind").count().collect()})
        examples: dict[str, list[dict[str, Any]]] = {}
        for kind in ANOMALY_KINDS:
            if counts[kind]:
                examples[kind] = _rows(found.filter(F.col("kind") == kind)
                                       .orderBy("broker", "transaction_id", "message_id").limit(EXAMPLES))
        result = AuditResult(
            state_counts=_rows(read_back["state_counts"].orderBy("producer_group", "topic")),
            latency=_rows(read_back["latency"].orderBy("producer_group", "topic")),
            checks=_rows(read_back["checks"].orderBy("producer_group", "topic", "checks_delivered")),
            anomaly_counts=counts, anomaly_examples=examples, transactions=transactions, messages=messages,
            seconds=time.monotonic() - started,
            latency_histogram=_rows(read_back["latency_histogram"].orderBy("producer_group", "topic", "bucket")),
            generated_at_ms=now_ms, phases=phases)
        phase("tables")
    finally:
        txns.unpersist()
        msgs.unpersist()
    _write_summary(result, output, nameserver, now_ms, pending_threshold_seconds)
    from txmq_pipeline import report
    result.reports = report.write(result, output, report_format, nameserver=nameserver,
                                  threshold=pending_threshold_seconds)
    phase("report")
    return result


def _local(output: str) -> str | None:
    if output.startswith("file:"):
        return "/" + output[len("file:"):].lstrip("/")
    return None if "://" in output else output


def _write_summary(result: AuditResult, output: str, nameserver: str, now_ms: int, threshold: float) -> None:
    path = _local(output)
    if path is None:
        log.warning("summary.json and the report are written on local paths only; %s is not one", output)
        return
    summary = {
        "generated_at_ms": now_ms, "nameserver": nameserver, "pending_threshold_seconds": threshold,
        "transactions": result.transactions, "messages": result.messages, "seconds": round(result.seconds, 3),
        "anomalies": result.anomalies, "anomaly_counts": result.anomaly_counts,
        "anomaly_examples": result.anomaly_examples, "state_counts": result.state_counts,
        "latency": result.latency, "checks": result.checks, "exit_status": result.exit_status,
        "phases_seconds": result.phases,
    }
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2, sort_keys=True, default=str)


class _Parser(argparse.ArgumentParser):
    """Bad flags exit EXIT_ERROR, not argparse's 2: a scheduled audit's 2 means anomalies."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_ERROR, f"{self.prog}: error: {message}\n")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = _Parser(prog="python -m txmq_pipeline.audit", description=__doc__.split("\n\n")[0],
                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nameserver", required=True, help="name server address list (host:port,host:port)")
    p.add_argument("--output", required=True, help="output directory (Parquet tables, summary.json, report)")
    p.add_argument("--topics", default="*", help="topics to reconcile (comma-separated; default: every user topic)")
    p.add_argument("--pending-threshold-seconds", type=float, default=DEFAULT_PENDING_THRESHOLD_SECONDS)
    p.add_argument("--report-format", choices=("both", "html", "md"), default="both",
                   help="report.html (self-contained) and/or report.md (default both)")
    p.add_argument("--master", default=None, help="Spark master (default: spark-submit's, else local[*])")
    p.add_argument("--transaction-partitions-per-broker", type=int, default=4)
    p.add_argument("--max-messages-per-partition", type=int, default=200_000)
    p.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"),
                   help="of the job's own log (txmq_pipeline.*)")
    add_tls_arguments(p.add_argument_group(
        "TLS (a cluster serving it, as the chart installs it; the files must exist on the executors too)"))
    f = p.add_argument_group("continuous audit (--follow)")
    f.add_argument("--follow", action="store_true",
                   help="run as a streaming job: keep tables/anomalies, summary.json and Prometheus metrics "
                        "up to date until stopped (SIGTERM/Ctrl-C)")
    f.add_argument("--checkpoint", default=None, help="checkpoint directory (default OUTPUT/_checkpoint)")
    f.add_argument("--interval-seconds", type=float, default=30.0, help="trigger and refresh interval")
    f.add_argument("--missing-grace-seconds", type=float, default=60.0,
                   help="a committed transaction whose message has not been read yet counts as missing after this")
    f.add_argument("--metrics-port", type=int, default=None, help="serve Prometheus metrics on this port")
    f.add_argument("--max-offsets-per-trigger", type=int, default=None)
    f.add_argument("--first-trigger-timeout-seconds", type=float, default=DEFAULT_FIRST_TRIGGER_TIMEOUT_SECONDS,
                   help="the first reconciliation waits for the stream's first trigger at most this long "
                        "(default %(default).0f)")
    args = p.parse_args(argv)
    if args.first_trigger_timeout_seconds < 0:
        p.error(f"--first-trigger-timeout-seconds must be 0 or more, not {args.first_trigger_timeout_seconds:g}")
    try:
        args.tls = tls_from_args(args)
    except InvalidFieldError as err:
        p.error(err.message)
    return args


def check_reachable(nameserver: str, tls: TLS | None) -> None:
    """Raises TxmqError when the name servers do not answer, before Spark starts: a cluster
    that cannot be reached fails in one line, not in a failed Spark job's trace."""
    client = _broker.connect(nameserver, tls)
    try:
        _broker.list_brokers(client)
    finally:
        client.close()


def _unreachable_hint(tls: TLS | None) -> str:
    if tls is None:
        return ("; if it serves TLS (the chart's default), pass --tls-ca, and --tls-cert and --tls-key "
                "where it requires client certificates (or set TXMQ_TLS_CA_FILE, TXMQ_TLS_CERT_FILE, "
                "TXMQ_TLS_KEY_FILE)")
    if not tls.cert_file:
        return "; if it requires client certificates, pass --tls-cert and --tls-key"
    return ""


def main(argv: Sequence[str] | None = None, *, spark: SparkSession | None = None,
         stop: threading.Event | None = None, registry: Any = None) -> int:
    """The job as ``python -m txmq_pipeline.audit ARGV`` runs it; its exit status.

    A caller running it inside its own process (a notebook, the tests) may pass ``spark``:
    the job then runs on that session (``--master`` unused) and leaves it running; with
    ``--follow``, ``stop`` (set it to stop the follower; default: SIGTERM/SIGINT) and
    ``registry`` (the Prometheus registry of its metrics; default: the process's)."""
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    logging.getLogger("txmq_pipeline").setLevel(args.log_level)
    try:
        check_reachable(args.nameserver, args.tls)
    except TxmqError as err:
        log.error("cannot reach the cluster through %s: %s%s", args.nameserver, err.message,
                  _unreachable_hint(args.tls) if isinstance(err, UnavailableError) else "")
        return EXIT_ERROR
    own_session = spark is None
    if spark is None:
        from txmq_pipeline.session import session

        spark = session("txmq-audit", args.master)
        spark.sparkContext.setLogLevel("WARN")
    if args.follow:
        try:
            return follow(spark, nameserver=args.nameserver, output=args.output,
                          checkpoint=args.checkpoint or os.path.join(args.output, "_checkpoint"),
                          topics=args.topics, pending_threshold_seconds=args.pending_threshold_seconds,
                          missing_grace_seconds=args.missing_grace_seconds, interval_seconds=args.interval_seconds,
                          metrics_port=args.metrics_port, max_offsets_per_trigger=args.max_offsets_per_trigger,
                          partitions_per_broker=args.transaction_partitions_per_broker, tls=args.tls,
                          stop=stop if stop is not None else stop_on_signals(), registry=registry,
                          first_trigger_timeout_seconds=args.first_trigger_timeout_seconds)
        except Exception:
            log.exception("the continuous audit failed")
            return EXIT_ERROR
        finally:
            if own_session:
                spark.stop()
    try:
        result = run(spark, nameserver=args.nameserver, output=args.output, topics=args.topics,
                     pending_threshold_seconds=args.pending_threshold_seconds, report_format=args.report_format,
                     partitions_per_broker=args.transaction_partitions_per_broker,
                     max_messages_per_partition=args.max_messages_per_partition, tls=args.tls)
    except Exception:
        log.exception("the audit failed")
        return EXIT_ERROR
    finally:
        if own_session:
            spark.stop()
    log.info("audited %d transactions and %d messages in %.1f s: %d anomalies %s", result.transactions,
             result.messages, result.seconds, result.anomalies,
             {k: v for k, v in result.anomaly_counts.items() if v})
    from txmq_pipeline.report import summary_line
    print(summary_line(result))
    for path in result.reports:
        print(f"report: {os.path.abspath(path)}")
    if not result.reports:
        print(f"tables: {args.output}/tables (the report is written on local paths only)")
    return result.exit_status


if __name__ == "__main__":
    sys.exit(main())
