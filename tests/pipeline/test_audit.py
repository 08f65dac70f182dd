"""The audit job on a workload with known outcomes (N commits, M rollbacks, K check
commits, D discards, P pending), then with anomalies injected into a stopped broker's
store: the job lists them by id and exits non-zero."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from txmq.v1 import admin_pb2, common_pb2
from txmq_pipeline import audit

from .anomalies import inject
from .browser import look_at
from .conftest import PIPELINE_BROKER_ENV, PIPELINE_CHECKER_ENV
from .helpers import producer, run_as_a_user, Scripted, send_workload, wait_settled

N, M, K, D, P = 9, 5, 3, 2, 1


def _only(rows, group):
    return [r for r in rows if r["producer_group"] == group]


@pytest.mark.timeout(600)  # a driver of its own (the job as a user runs it: 250 s at a load of 15), Chromium
def test_audit_counts_known_outcomes_then_finds_injected_anomalies(spark, fresh_cluster_factory, unique_name,
                                                                   tmp_path):
    cluster = fresh_cluster_factory(brokers=2, broker_env=PIPELINE_BROKER_ENV, checker=True,
                                    checker_env=PIPELINE_CHECKER_ENV)
    topic, group = unique_name("audit"), unique_name("g")
    cluster.create_topic(topic, 2)
    with producer(cluster, group, Scripted()) as p:
        results = send_workload(p, topic, {"commit": N, "rollback": M, "check-commit": K, "discard": D,
                                           "pending": P})
        rows = wait_settled(cluster, group, N + M + K + D + P, pending=P)
    assert sum(1 for t in rows if t.state == common_pb2.TRANSACTION_STATE_DISCARDED) == D

    # 1. The workload as it is: exact counts; the discards are the only anomalies.
    out1 = tmp_path / "run1"
    r1 = audit.run(spark, nameserver=cluster.nameserver_address, output=str(out1), topics=topic,
                   pending_threshold_seconds=3600)
    [counts] = _only(r1.state_counts, group)
    assert (counts["total"], counts["committed"], counts["rolled_back"], counts["discarded"], counts["pending"]) \
        == (N + M + K + D + P, N + K, M, D, P)
    assert (counts["source_client"], counts["source_check"], counts["source_broker"], counts["source_operator"]) \
        == (N + M, K, D, 0)
    [lat] = _only(r1.latency, group)
    assert lat["resolved"] == N + M + K and 0 <= lat["p50_seconds"] <= lat["p90_seconds"] <= lat["p99_seconds"]
    checks = {c["checks_delivered"]: c["transactions"] for c in _only(r1.checks, group)}
    assert checks[2] == D and checks[0] == N + M + P and sum(checks.values()) == N + M + K + D + P
    assert r1.anomaly_counts == {"committed_missing": 0, "uncommitted_in_topic": 0, "duplicate_message_id": 0,
                                 "pending_too_old": 0, "discarded_unresolved": D}
    assert {a["transaction_id"] for a in r1.anomaly_examples["discarded_unresolved"]} \
        == {r.transaction_id for r in results["discard"]}
    assert r1.exit_status != 0
    summary = json.loads((out1 / "summary.json").read_text())
    assert summary["anomaly_counts"]["discarded_unresolved"] == D and summary["exit_status"] == 2
    for name in ("state_counts", "latency", "checks", "anomalies"):
        assert pq.read_table(out1 / "tables" / name).num_rows >= 1
    assert (out1 / "report.md").read_text().count("discarded_unresolved") >= D
    assert (out1 / "state_counts.png").read_bytes()[:4] == b"\x89PNG"
    assert (out1 / "latency.png").read_bytes()[:4] == b"\x89PNG"

    # 2. An operator resolves the discards: clean, exit status 0.
    for r in results["discard"]:
        cluster.admin_stub().ResolveTransaction(admin_pb2.ResolveTransactionRequest(
            transaction_id=r.transaction_id, resolution=common_pb2.TRANSACTION_RESOLUTION_ROLLBACK,
            operator="test", reason="audit test"), timeout=10)
    out2 = tmp_path / "run2"
    r2 = audit.run(spark, nameserver=cluster.nameserver_address, output=str(out2), topics=topic,
                   pending_threshold_seconds=3600)
    [counts] = _only(r2.state_counts, group)
    assert (counts["rolled_back"], counts["discarded"], counts["source_operator"]) == (M + D, 0, D)
    assert r2.anomalies == 0 and r2.exit_status == 0

    # 3. Anomalies injected into broker-0's stopped store: a committed row whose message is
    #    missing and a message entered twice in its queue. The job, run as a user runs it
    #    (the README's command from another directory, in an environment with no
    #    PYSPARK_PYTHON and no PYTHONPATH: its own Spark, local[*]), lists them by id,
    #    prints where its report is and exits non-zero.
    cluster.stop_broker(0)
    injected = inject(str(cluster.workdir / "broker-0"), "broker-0", topic=topic, group=group)
    cluster.restart_broker(0)
    cluster.wait_route(topic, 2)
    job = run_as_a_user(["--nameserver", cluster.nameserver_address, "--output", "./audit-out",
                         "--topics", topic, "--pending-threshold-seconds", "0"], cwd=tmp_path)
    assert job.returncode == audit.EXIT_ANOMALIES, job.stderr[-3000:]
    out3 = tmp_path / "audit-out"
    assert f"report: {out3 / 'report.html'}" in job.stdout and f"report: {out3 / 'report.md'}" in job.stdout
    assert "Attention: 3 anomalies" in job.stdout, job.stdout
    assert "reading the transaction tables" in job.stderr  # it says what it is doing
    summary = json.loads((out3 / "summary.json").read_text())
    assert summary["anomaly_counts"] == {"committed_missing": 1, "uncommitted_in_topic": 0,
                                         "duplicate_message_id": 1, "pending_too_old": P,
                                         "discarded_unresolved": 0}
    examples = summary["anomaly_examples"]
    assert [a["transaction_id"] for a in examples["committed_missing"]] == [injected.missing_transaction_id]
    assert [a["message_id"] for a in examples["committed_missing"]] == [injected.missing_message_id]
    assert [a["message_id"] for a in examples["duplicate_message_id"]] == [injected.duplicate_message_id]
    assert [a["transaction_id"] for a in examples["pending_too_old"]] == [r.transaction_id for r in results["pending"]]
    anomalies = pq.read_table(out3 / "tables" / "anomalies").to_pylist()
    assert {a["kind"] for a in anomalies} == {"committed_missing", "duplicate_message_id", "pending_too_old"}
    assert injected.missing_transaction_id in (out3 / "report.md").read_text()

    # 4. The HTML reports as a person sees them in a browser.
    seen = look_at(out3 / "report.html")
    assert seen["summary"].startswith("Attention: 3 anomalies"), seen["summary"]
    assert 0 <= seen["summaryBox"]["top"] < seen["innerHeight"] / 2  # at the top, no scrolling
    assert cluster.nameserver_address in seen["header"] and " UTC" in seen["header"]
    assert [(i["id"], i["complete"], i["naturalWidth"] > 0) for i in seen["images"]] \
        == [("chart-states", True, True), ("chart-latency", True, True)]
    tables = {t["id"]: t for t in seen["tables"]}
    assert set(tables) == {"anomalies-committed_missing", "anomalies-duplicate_message_id",
                           "anomalies-pending_too_old", "table-states", "table-latency", "table-checks"}
    assert all(t["rows"] >= 1 and t["width"] <= seen["innerWidth"] for t in tables.values()), tables
    assert seen["scrollWidth"] <= seen["innerWidth"]  # nothing wider than the page
    assert injected.missing_transaction_id in tables["anomalies-committed_missing"]["text"]
    [pending_id] = [r.transaction_id for r in results["pending"]]
    # Every anomaly's first command is txn describe of its whole id; a pending transaction's
    # decision is not filled in (the report says how to decide instead).
    [pending_block] = [p for p in seen["pre"] if pending_id in p]
    lines = pending_block.splitlines()
    assert lines[0] == f"txmq --nameserver {cluster.nameserver_address} txn describe {pending_id}", lines
    assert "--rollback" not in pending_block and "--commit" not in pending_block
    assert "COMMIT_OR_ROLLBACK" in lines[1] and lines[1].startswith("#")
    assert f"txn describe {injected.missing_transaction_id}" in "\n".join(seen["pre"])
    clean = look_at(out2 / "report.html")
    assert clean["summary"].startswith("All is well"), clean["summary"]
    assert all(i["naturalWidth"] > 0 for i in clean["images"]) and len(clean["images"]) == 2
