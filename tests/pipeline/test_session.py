"""The settings txmq_pipeline's own SparkSession (the audit's drivers) adds where the user
set none, and how it starts its JVM."""

from __future__ import annotations

import subprocess
import sys

from pyspark import SparkConf

from txmq_pipeline.session import JVM_START_ATTEMPTS, defaults

from .helpers import clean_env

NOTHING_SET = SparkConf(loadDefaults=False)


def test_python_processes_wait_long_enough_for_the_jvm_on_a_busy_machine():
    # Spark's 15 s for the JVM and a Python process to connect (a result fetched by the
    # driver, a worker or a data source's planner starting) is too short on a busy machine.
    for master in ("local[2]", "local[*]", "k8s://https://kubernetes.default", "spark://host:7077"):
        assert defaults(master, NOTHING_SET)["spark.python.authenticate.socketTimeout"] == "120s", master


def test_the_local_defaults_are_for_local_masters_only():
    assert defaults("local[2]", NOTHING_SET)["spark.sql.shuffle.partitions"] == "8"
    assert "spark.sql.shuffle.partitions" not in defaults("k8s://https://kubernetes.default", NOTHING_SET)


def test_what_the_user_set_wins():
    given = SparkConf(loadDefaults=False).set("spark.python.authenticate.socketTimeout", "30s")
    assert "spark.python.authenticate.socketTimeout" not in defaults("local[2]", given)


def test_a_jvm_that_exits_before_its_port_is_started_again_then_the_error_is_the_users(tmp_path):
    # A JVM that cannot start at all (an option it does not know, from the user's own
    # JVM options): the session every entry point opens starts it JVM_START_ATTEMPTS
    # times, saying so, then fails with Spark's own error. (The transient this is for —
    # threads running out for a moment on a busy machine — cannot be provoked on demand.)
    env = {**clean_env(), "JAVA_TOOL_OPTIONS": "-XX:+TxmqNoSuchOption"}
    job = subprocess.run([sys.executable, "-c", "import logging; logging.basicConfig(); "
                          "from txmq_pipeline.session import session; session('txmq-test', 'local[1]')"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert job.returncode != 0
    assert job.stderr.count("the JVM exited before handing over its port") == JVM_START_ATTEMPTS - 1, \
        job.stderr[-3000:]
    assert "JAVA_GATEWAY_EXITED" in job.stderr
