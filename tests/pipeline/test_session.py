"""The settings txmq_pipeline's own SparkSession (the audit's drivers) adds where the user
set none."""

from __future__ import annotations

from pyspark import SparkConf

from txmq_pipeline.session import defaults

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
