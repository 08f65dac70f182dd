"""The follower's start: its first reconciliation waits for the stream's first trigger
(the stream's source starts in a Python process Spark gives a fixed 10 s to connect back;
a reconciliation beside it made it miss that on a busy machine), and reconciles anyway,
saying so, when that trigger has not run within its timeout.

The stream here is a real Structured Streaming query on the tests' session, its source a
Python data source whose first trigger is held back at a gate (:mod:`.gated_source`); the
reconciliation is the real one, against the shared cluster."""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest
from prometheus_client import CollectorRegistry

from tests.support.waiting import wait_until
from txmq_pipeline import audit
from txmq_pipeline.follow import AuditMetrics, Follower

from . import gated_source

#: How long the gate stays shut once the follower waits at it: 25 of its 0.2 s polls. A
#: follower that does not wait starts reconciling within one poll.
HOLD_SECONDS = 5.0


class _Records(logging.Handler):
    """(time.monotonic(), level, message) of the follower's log records."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[tuple[float, str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append((time.monotonic(), record.levelname, record.getMessage()))

    def first(self, text: str) -> float | None:
        return next((t for t, _, m in list(self.records) if text in m), None)


@pytest.fixture
def records() -> Iterator[_Records]:
    logger = logging.getLogger("txmq_pipeline.follow")
    handler, level = _Records(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


@contextlib.contextmanager
def _watching(spark, cluster, unique_name, tmp_path, **watch) -> Iterator[tuple[Follower, Path, object]]:
    """(follower, gate, query) of a follower watching a gated stream in a thread while the block
    runs; afterwards the gate is opened, the follower stopped and its result checked."""
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(gated_source)  # the source's process need not import the tests
    spark.dataSource.register(gated_source.GatedSource)
    topic = unique_name("start")
    cluster.create_topic(topic, 1)
    out, checkpoint, gate = tmp_path / "out", tmp_path / "checkpoint", tmp_path / "gate"
    out.mkdir()
    follower = Follower(spark, nameserver=cluster.nameserver_address, output=str(out), checkpoint=str(checkpoint),
                        topics=topic, pending_threshold_seconds=3600, missing_grace_seconds=60,
                        metrics=AuditMetrics(CollectorRegistry()), partitions_per_broker=1)
    query = (spark.readStream.format("txmq_test_gated").option("gate", str(gate)).load()
             .writeStream.foreachBatch(follower.batch).option("checkpointLocation", str(checkpoint / "stream"))
             .trigger(processingTime="0.2 seconds").start())
    stop, outcome = threading.Event(), {}

    def watch_it() -> None:
        try:
            outcome["status"] = follower.watch(query, interval_seconds=0.2, stop=stop, **watch)
        except BaseException as exc:  # noqa: BLE001 - reported by the test's thread
            outcome["error"] = exc

    thread = threading.Thread(target=watch_it, name="follower", daemon=True)
    thread.start()
    try:
        yield follower, gate, query
    finally:
        gate.touch()  # a query stops once its source's call returns
        stop.set()
        thread.join(120)
        if thread.is_alive():
            query.stop()
    assert not thread.is_alive(), "the follower did not stop"
    assert outcome == {"status": 0}, outcome
    assert not query.isActive


def _reconciled(follower: Follower) -> dict:
    wait_until(lambda: follower.last_evaluated is not None, 240, interval=0.2, message="no reconciliation")
    return json.loads(Path(follower.output, "summary.json").read_text())


@pytest.mark.timeout(400)
def test_first_reconciliation_waits_for_the_streams_first_trigger(spark, txmq_cluster, unique_name, tmp_path,
                                                                  records):
    with _watching(spark, txmq_cluster, unique_name, tmp_path) as (follower, gate, _query):
        # The source's process is up and held at the gate, the follower waiting for it.
        wait_until(lambda: gate.with_name("gate.reached").exists(), 120, interval=0.1,
                   message="the stream's source never started")
        wait_until(lambda: records.first("waiting for the stream's first trigger"), 60, interval=0.1,
                   message=lambda: f"the follower does not wait for the stream: {records.records}")
        held = threading.Event()
        held.wait(HOLD_SECONDS)
        assert follower.last_evaluated is None and not follower.lock.locked() \
            and records.first("reconciling") is None, f"reconciled while the stream was starting: {records.records}"

        gate.touch()
        opened = time.monotonic()
        summary = _reconciled(follower)  # the first batch's (empty: the source has no data)
        assert records.first("reconciling") >= opened
        assert summary["last_batch_id"] == 0 and summary["messages"] == 0 and summary["anomalies"] == 0, summary
        # Past its wait, the follower reconciles every interval.
        wait_until(lambda: records.first("the stream ran its first trigger"), 120, interval=0.1,
                   message=lambda: f"the follower never saw the first trigger end: {records.records}")
        wait_until(lambda: sum("reconciling: queue offsets" in m for _, _, m in records.records) >= 2, 240,
                   interval=0.2, message=lambda: f"no reconciliation after the first: {records.records}")


@pytest.mark.timeout(400)
def test_a_first_trigger_that_does_not_come_is_reported_and_the_follower_reconciles_anyway(
        spark, txmq_cluster, unique_name, tmp_path, records):
    with _watching(spark, txmq_cluster, unique_name, tmp_path, first_trigger_timeout_seconds=1.0) \
            as (follower, _gate, query):
        summary = _reconciled(follower)
        assert query.lastProgress is None  # the stream still has not run its first trigger
        warned = [m for _, level, m in records.records if level == "WARNING"]
        assert any("has not run its first trigger in 1 s" in m for m in warned), records.records
        assert summary["last_batch_id"] is None and summary["anomalies"] == 0, summary


def test_a_negative_first_trigger_timeout_is_refused(capsys):
    with pytest.raises(SystemExit) as exit:
        audit.parse_args(["--nameserver", "127.0.0.1:1", "--output", "out", "--follow",
                          "--first-trigger-timeout-seconds", "-1"])
    assert exit.value.code == audit.EXIT_ERROR
    assert "--first-trigger-timeout-seconds must be 0 or more, not -1" in capsys.readouterr().err
