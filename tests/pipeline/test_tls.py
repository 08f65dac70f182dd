"""The Spark connector over TLS: its `tls.*` options (the CLI's --tls-* flags) reach the
driver's and the tasks' channels; without them a TLS cluster refuses the read. The audit
job reaches the cluster with the --tls-* flags and the TXMQ_TLS_* variables, and, run as
a user runs it, without them says what is missing."""

from __future__ import annotations

import json
from typing import Any, Iterator

import pytest

import txmq
from tests.support.certs import CertificateAuthority
from tests.support.cluster import Cluster
from txmq_pipeline import audit

from .helpers import producer, run_as_a_user, Scripted, send_workload, wait_settled


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    ca = CertificateAuthority(tmp_path_factory.mktemp("pki"))
    c = Cluster(tmp_path_factory.mktemp("pipeline-tls"), tls=ca)
    try:
        yield c
    finally:
        c.stop()


def test_a_batch_read_over_mutual_tls(spark: Any, secure: Cluster, unique_name) -> None:
    topic = unique_name("tls-read")
    secure.create_topic(topic, 2)
    with txmq.Producer(secure.nameserver_address, tls=secure.client_tls()) as producer:
        for i in range(5):
            producer.send(txmq.Message(topic, b"tls-%d" % i))
    tls = secure.client_tls()
    options = {"nameserver": secure.nameserver_address, "topic": topic,
               "tls.ca": tls.ca_file, "tls.cert": tls.cert_file, "tls.key": tls.key_file}
    rows = spark.read.format("txmq").options(**options).load().select("body").collect()
    assert sorted(bytes(r.body) for r in rows) == [b"tls-%d" % i for i in range(5)]

    plain = {k: v for k, v in options.items() if not k.startswith("tls.")}
    with pytest.raises(Exception, match="(?i)unavailable"):
        spark.read.format("txmq").options(**plain).load().collect()


def test_the_audit_job_over_mutual_tls_with_the_flags_and_the_environment(spark: Any, secure: Cluster, unique_name,
                                                                         tmp_path, monkeypatch) -> None:
    """The job's entry point (``audit.main``, what ``python -m txmq_pipeline.audit`` runs)
    on the tests' session: the CA and server name from flags, the client certificate and
    key from TXMQ_TLS_* only, so the job fails if either source is not read (without the
    flags no CA; without the environment no client certificate). The job in a driver of
    its own, as a user runs it, is test_audit's (plaintext) and test_follow's."""
    topic, group = unique_name("tls-audit"), unique_name("g")
    secure.create_topic(topic, 2)
    with producer(secure, group, Scripted()) as p:
        send_workload(p, topic, {"commit": 4, "rollback": 2, "pending": 1})
        wait_settled(secure, group, 7, pending=1)
    tls = secure.client_tls()
    monkeypatch.setenv("TXMQ_TLS_CERT_FILE", tls.cert_file)
    monkeypatch.setenv("TXMQ_TLS_KEY_FILE", tls.key_file)
    out = tmp_path / "out"
    status = audit.main(["--nameserver", secure.nameserver_address, "--topics", topic, "--master", "local[2]",
                         "--report-format", "md", "--transaction-partitions-per-broker", "1", "--output", str(out),
                         "--tls-ca", tls.ca_file, "--tls-server-name", "localhost"], spark=spark)
    assert status == 0
    assert spark.range(3).count() == 3  # the caller's session is left running
    summary = json.loads((out / "summary.json").read_text())
    [counts] = [c for c in summary["state_counts"] if c["producer_group"] == group]
    assert (summary["transactions"], summary["messages"], summary["anomalies"]) == (7, 4, 0), summary
    assert (counts["committed"], counts["rolled_back"], counts["pending"]) == (4, 2, 1), counts
    assert (out / "report.md").exists() and not (out / "report.html").exists()  # --report-format md


def test_the_audit_job_without_tls_settings_says_what_is_missing(secure: Cluster, tmp_path) -> None:
    tls = secure.client_tls()
    base = ["--nameserver", secure.nameserver_address, "--output", "./out"]

    job = run_as_a_user(base, cwd=tmp_path)
    assert job.returncode == 1, job.stderr[-3000:]
    assert "cannot reach the cluster" in job.stderr and "--tls-ca" in job.stderr, job.stderr[-3000:]
    assert "Traceback" not in job.stderr  # one line, before Spark starts

    job = run_as_a_user([*base, "--tls-ca", tls.ca_file], cwd=tmp_path)  # no client certificate
    assert job.returncode == 1, job.stderr[-3000:]
    assert "--tls-cert and --tls-key" in job.stderr, job.stderr[-3000:]

    # A bad flag is an error (1), never the anomalies' status (2) a scheduled audit alerts on.
    job = run_as_a_user([*base, "--tls-ca", str(tmp_path / "nope.crt")], cwd=tmp_path)
    assert job.returncode == 1 and "--tls-ca" in job.stderr and "not a readable file" in job.stderr, job.stderr
    job = run_as_a_user(base, cwd=tmp_path, env={"TXMQ_TLS_CA_FILE": tls.ca_file,
                                                   "TXMQ_TLS_CERT_FILE": tls.cert_file})
    assert job.returncode == 1 and "--tls-key (or $TXMQ_TLS_KEY_FILE): missing" in job.stderr, job.stderr
