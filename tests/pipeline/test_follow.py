"""The continuous audit (``python -m txmq_pipeline.audit --follow``): anomalies appear in
its Prometheus metrics and tables while it runs; killed and started again on the same
checkpoint, it resumes without reading anything twice and finds what was injected
meanwhile.

One follower runs as a user runs it (a process, a Spark driver of its own: the command's
end to end); the others run the same entry point, ``audit.main``, on the tests' session
(:class:`_InProcess`), which spares a JVM start-up and its cold first jobs each."""

from __future__ import annotations

import ast
import contextlib
import json
import logging
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import pyarrow.parquet as pq
import pytest

from tests.support.certs import CertificateAuthority
from tests.support.waiting import wait_until
from txmq_pipeline import audit

from .anomalies import inject
from .conftest import PIPELINE_BROKER_ENV, PIPELINE_CHECKER_ENV
from .helpers import clean_env, producer, Scripted, send_workload, wait_settled


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _argv(cluster, topic, out, port, *extra) -> list[str]:
    return ["--follow", "--nameserver", cluster.nameserver_address, "--output", str(out), "--topics", topic,
            "--master", "local[2]", "--interval-seconds", "0.5", "--pending-threshold-seconds", "2",
            "--missing-grace-seconds", "2", "--metrics-port", str(port), "--transaction-partitions-per-broker", "1",
            "--log-level", "DEBUG", *extra]


def _start(cluster, topic, out, port, log_path, *extra, env=None):
    """The follower as a user runs it: ``python -m txmq_pipeline.audit --follow``, a
    Spark driver of its own (its environment plus ``env``)."""
    log = open(log_path, "ab")
    return subprocess.Popen([sys.executable, "-m", "txmq_pipeline.audit", *_argv(cluster, topic, out, port, *extra)],
                            cwd=out.parent, env={**clean_env(), **(env or {})}, stdout=log, stderr=subprocess.STDOUT)


def _slow_first_source(tmp_path) -> str:
    """A Python for Spark's workers (``PYSPARK_PYTHON``) whose first streaming source
    process starts 12 s late, as on a busy machine: past the fixed 10 s Spark waits for it
    to connect back, so the query's first start fails."""
    script, mark = tmp_path / "slow-python", tmp_path / "slow-python.started"
    script.write_text(f"""#!/bin/sh
case "$*" in *python_streaming_source_runner*) mkdir '{mark}' 2>/dev/null && sleep 12;; esac
exec '{sys.executable}' "$@"
""")
    script.chmod(0o755)
    return str(script)


class _InProcess:
    """The follower's entry point (``audit.main(["--follow", ...])``, what the command runs)
    on the tests' SparkSession, in a thread: no JVM of its own to start. ``poll()``,
    ``returncode`` and ``wait()`` as a process's; :meth:`stop` is its SIGTERM."""

    def __init__(self, spark, argv: list[str], log_path) -> None:
        from prometheus_client import CollectorRegistry

        self.returncode: int | None = None
        self._stop = threading.Event()
        self._log = logging.FileHandler(log_path)
        self._log.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
        logging.getLogger("txmq_pipeline").addHandler(self._log)
        self._thread = threading.Thread(target=self._main, args=(spark, argv, CollectorRegistry()),
                                        name="follower", daemon=True)
        self._thread.start()

    def _main(self, spark, argv, registry) -> None:
        try:
            self.returncode = audit.main(argv, spark=spark, stop=self._stop, registry=registry)
        except BaseException:
            logging.getLogger("txmq_pipeline").exception("audit.main raised")
            self.returncode = -1

    def poll(self) -> int | None:
        return None if self._thread.is_alive() else self.returncode

    def stop(self) -> None:
        self._stop.set()

    def wait(self, timeout: float) -> int | None:
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"the follower did not stop within {timeout} s")
        logging.getLogger("txmq_pipeline").removeHandler(self._log)
        self._log.close()
        return self.returncode


@contextlib.contextmanager
def _following(cluster, topic, out, log_path, *extra, spark=None):
    """(follower, metrics port) of a follower that runs while the block does: a process,
    or with ``spark`` the entry point on that session (:class:`_InProcess`). Stopped with
    SIGTERM after the block (a clean stop: exit status 0); a process is killed when the
    block fails."""
    port = _free_port()
    if spark is not None:
        follower = _InProcess(spark, _argv(cluster, topic, out, port, *extra), log_path)
        try:
            yield follower, port
        finally:
            follower.stop()
            status = follower.wait(60)
        assert status == 0, log_path.read_text()[-3000:]
        assert _metrics(port) == {}, "the metrics are still served after the follower returned"
        return
    proc = _start(cluster, topic, out, port, log_path, *extra)
    try:
        yield proc, port
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log_path.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


def _metrics(port: int) -> dict[str, float]:
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        m = re.match(r'^(txmq_audit_\w+)(?:\{kind="(\w+)"\})? ([0-9.e+-]+)$', line)
        if m:
            out[m.group(2) or m.group(1)] = float(m.group(3))
    return out


def _wait_metrics(port, expected: dict[str, float], proc, log_path, timeout=300.0) -> dict[str, float]:
    def matches():
        assert proc.poll() is None, f"the follower exited {proc.returncode}: {log_path.read_text()[-3000:]}"
        m = _metrics(port)
        assert m.get("txmq_audit_messages", 0) <= expected.get("txmq_audit_messages", float("inf")), \
            f"more messages than there are: {m}"  # read twice
        return m if m and all(m.get(k) == v for k, v in expected.items()) else None

    return wait_until(matches, timeout, interval=0.3,
                      message=lambda: f"metrics never matched {expected}: {_metrics(port)}; the follower's log: "
                                      + "\n".join(line for line in log_path.read_text().splitlines()
                                                   if "txmq_pipeline" in line)[-4000:])


@pytest.mark.timeout(600)  # a Spark driver of its own starts (slow on a loaded machine)
def test_follow_updates_anomalies_as_they_happen_and_resumes_after_a_crash(spark, fresh_cluster_factory, unique_name,
                                                                         tmp_path):
    """The follower as a user runs it, on a machine so busy that its stream's source starts
    too slowly the first time (the query is started again), SIGKILLed; started again on its
    checkpoint (by the entry point on the tests' session: another driver, as after a crash)."""
    cluster = fresh_cluster_factory(brokers=1, broker_env=PIPELINE_BROKER_ENV, checker=True,
                                    checker_env=PIPELINE_CHECKER_ENV)
    topic, group = unique_name("follow"), unique_name("g")
    cluster.create_topic(topic, 2)
    out, port, log_path = tmp_path / "audit", _free_port(), tmp_path / "follow.log"
    with producer(cluster, group, Scripted()) as p:
        send_workload(p, topic, {"commit": 6, "rollback": 2})
        wait_settled(cluster, group, 8)

        proc = _start(cluster, topic, out, port, log_path, env={"PYSPARK_PYTHON": _slow_first_source(tmp_path)})
        try:
            _wait_metrics(port, {"txmq_audit_messages": 6, "txmq_audit_transactions": 8, "committed_missing": 0,
                                 "uncommitted_in_topic": 0, "duplicate_message_id": 0, "pending_too_old": 0,
                                 "discarded_unresolved": 0}, proc, log_path)
            assert "did not connect back within Spark's fixed 10 s" in log_path.read_text()  # and started again

            # While it runs: a discarded transaction, one left pending, more commits.
            results = send_workload(p, topic, {"discard": 1, "pending": 1, "commit": 3})
            wait_settled(cluster, group, 13, pending=1)
            _wait_metrics(port, {"txmq_audit_messages": 9, "discarded_unresolved": 1, "pending_too_old": 1,
                                 "committed_missing": 0, "duplicate_message_id": 0, "uncommitted_in_topic": 0},
                          proc, log_path)
            found = pq.read_table(out / "tables" / "anomalies").to_pylist()
            assert {(a["kind"], a["transaction_id"]) for a in found} == {
                ("discarded_unresolved", results["discard"][0].transaction_id),
                ("pending_too_old", results["pending"][0].transaction_id)}
            assert json.loads((out / "summary.json").read_text())["anomalies"] == 2
            # Spark commits a batch once its reconciliation has returned: the crash comes after
            # that (on a loaded machine it once came before, and the last commit below was an
            # earlier batch's).
            wait_until(lambda: _last_batch_committed(out), 60, interval=0.3, message="Spark never committed its batch")
        finally:
            proc.send_signal(signal.SIGKILL)  # a crash, not a clean stop
            proc.wait(30)
    # Not even for a moment did it report what was not there (e.g. committed messages the
    # stream had not read yet as missing).
    reported = re.findall(r"anomalies (\{.*?\}|none)", log_path.read_text())
    assert reported and all(r == "none" or set(ast.literal_eval(r)) <= {"discarded_unresolved", "pending_too_old"}
                            for r in reported), reported

    # Make the crash land between the follower's write of its last batch and Spark's commit
    # of it: Spark then runs that batch again, with the same id and offsets.
    commits = sorted((out / "_checkpoint" / "stream" / "commits").glob("[0-9]*"), key=lambda f: int(f.name))
    assert commits, "no micro-batch committed"
    commits[-1].unlink()
    commits[-1].with_name(f".{commits[-1].name}.crc").unlink(missing_ok=True)

    # Meanwhile: a committed transaction whose message is gone, one message entered twice and
    # the pending transaction's half message made visible in its queue.
    cluster.stop_broker(0)
    pending_id = results["pending"][0].transaction_id
    injected = inject(str(cluster.workdir / "broker-0"), "broker-0", topic=topic, group=group, expose=pending_id)
    cluster.restart_broker(0)
    cluster.wait_route(topic, 2)

    with _following(cluster, topic, out, log_path, spark=spark) as (proc, port):  # then a clean stop
        # 9 messages + the duplicate's second offset + the exposed half message: nothing read
        # twice across the restart.
        m = _wait_metrics(port, {"txmq_audit_messages": 11, "committed_missing": 1, "duplicate_message_id": 1,
                                 "discarded_unresolved": 1, "pending_too_old": 1, "uncommitted_in_topic": 1},
                          proc, log_path)
        assert m["txmq_audit_batches_total"] >= 1
        assert f"batch {int(commits[-1].name)}:" in log_path.read_text().split("following")[-1]  # re-run
        found = pq.read_table(out / "tables" / "anomalies").to_pylist()
        assert {(a["kind"], a["message_id"]) for a in found if a["kind"] in ("committed_missing",
                                                                               "duplicate_message_id")} \
            == {("committed_missing", injected.missing_message_id),
                ("duplicate_message_id", injected.duplicate_message_id)}
        assert [a["transaction_id"] for a in found if a["kind"] == "uncommitted_in_topic"] == [pending_id]


def _last_batch_committed(out) -> bool:
    """Spark has committed every micro-batch it planned (a restart has none to run again)."""
    stream = out / "_checkpoint" / "stream"
    planned, committed = ({int(f.name) for f in (stream / d).glob("[0-9]*")} for d in ("offsets", "commits"))
    return bool(planned) and max(planned) in committed


@pytest.mark.timeout(600)  # two followers, one after the other, each reconciling for tens of seconds when loaded
def test_follow_started_again_with_no_new_messages_reconciles_every_interval(spark, fresh_cluster_factory, unique_name,
                                                                           tmp_path):
    """A stuck transaction makes no message: started again on its checkpoint with nothing new
    to read, so that Spark runs no micro-batch, the follower still reconciles what the
    earlier run stored, reports the pending transaction again and keeps doing so. (The
    follower's entry point on the tests' session; a follower started as a user starts it,
    then killed and started again, is the test above.)"""
    cluster = fresh_cluster_factory(brokers=1, broker_env=PIPELINE_BROKER_ENV)
    topic, group = unique_name("resume"), unique_name("g")
    cluster.create_topic(topic, 2)
    out, log_path = tmp_path / "audit", tmp_path / "follow.log"
    anomaly = {"txmq_audit_messages": 3, "pending_too_old": 1, "committed_missing": 0, "uncommitted_in_topic": 0,
               "duplicate_message_id": 0, "discarded_unresolved": 0}
    with producer(cluster, group, Scripted()) as p:
        send_workload(p, topic, {"commit": 3, "pending": 1})
        wait_settled(cluster, group, 4, pending=1)

        with _following(cluster, topic, out, log_path, spark=spark) as (proc, port):
            _wait_metrics(port, anomaly, proc, log_path)
            wait_until(lambda: _last_batch_committed(out), 60, interval=0.3, message="Spark never committed its batch")

        restarted = time.time()
        with _following(cluster, topic, out, log_path, spark=spark) as (proc, port):
            m = _wait_metrics(port, anomaly, proc, log_path)
            assert m["txmq_audit_batches_total"] == 0, m  # reconciled without a micro-batch
            first = m["txmq_audit_last_reconciliation_timestamp_seconds"]
            assert first >= restarted, m
            # The next one starts an interval after this one ended and takes about as long
            # (48-55 s each on a loaded machine, where 60 s in all was too short).
            took = m.get("txmq_audit_reconciliation_seconds", 0.0)
            wait_until(lambda: _metrics(port).get("txmq_audit_last_reconciliation_timestamp_seconds", 0) > first,
                       60 + 2 * took, interval=0.3, message=lambda: f"no second reconciliation: {_metrics(port)}")


@pytest.mark.timeout(300)
def test_follow_over_mutual_tls(spark, fresh_cluster_factory, unique_name, tmp_path):
    """With the --tls-* flags the streaming read and the follower's own reads reach a
    cluster that requires client certificates (the follower's entry point on the tests'
    session)."""
    cluster = fresh_cluster_factory(brokers=1, broker_env=PIPELINE_BROKER_ENV,
                                    tls=CertificateAuthority(tmp_path / "pki"))
    topic, group = unique_name("follow-tls"), unique_name("g")
    cluster.create_topic(topic, 2)
    with producer(cluster, group, Scripted()) as p:
        send_workload(p, topic, {"commit": 3, "pending": 1})
        wait_settled(cluster, group, 4, pending=1)
    tls = cluster.client_tls()
    out, log_path = tmp_path / "audit", tmp_path / "follow.log"
    with _following(cluster, topic, out, log_path, "--tls-ca", tls.ca_file, "--tls-cert", tls.cert_file,
                    "--tls-key", tls.key_file, spark=spark) as (proc, port):
        _wait_metrics(port, {"txmq_audit_messages": 3, "txmq_audit_transactions": 4, "pending_too_old": 1,
                             "committed_missing": 0, "uncommitted_in_topic": 0, "duplicate_message_id": 0,
                             "discarded_unresolved": 0}, proc, log_path)
