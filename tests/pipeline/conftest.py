"""Spark for the pipeline tests: ONE local[2] SparkSession for the whole test session (a
JVM costs seconds and ~1 GB), the ``txmq`` data source registered, workers running the
venv's interpreter (which has txmq_pipeline installed)."""

from __future__ import annotations

import os
import sys
from typing import Any, Iterator

import pytest

import pyspark  # (make pipeline-deps installs it; a missing PySpark must fail, not skip)

from txmq_pipeline.session import get_or_create

from tests.support import presets

from .helpers import TEST_JVM_OPTIONS

os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
#: The JIT of every test JVM (helpers.TEST_JVM_OPTIONS): C1 only, ~40 % less CPU for jobs
#: of seconds (measured: a small job's JVM 20-24 s of CPU → 12-14 s). Nothing Spark reads.
#: The session's JVM takes it from SPARK_SUBMIT_OPTS; a driver run as a user runs it
#: (helpers.clean_env, which drops SPARK_*) from JAVA_TOOL_OPTIONS: a JVM setting, pointing
#: nothing at our code. (The audit job run as a user, at a load of 4: 32-36 s with it,
#: 46-47 s with the default JIT; a follower's reconciliations took 48-55 s on a loaded
#: machine with either.)
os.environ.setdefault("SPARK_SUBMIT_OPTS", TEST_JVM_OPTIONS)


@pytest.fixture(scope="session")
def spark() -> Iterator["pyspark.sql.SparkSession"]:
    from pyspark.sql import SparkSession

    import txmq_pipeline

    builder = (SparkSession.builder.master("local[2]").appName("txmq-pipeline-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.default.parallelism", "2")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.sql.python.filterPushdown.enabled", "true")
               .config("spark.driver.memory", "1g")
               # What txmq_pipeline.session gives the audit's own drivers (session.DEFAULTS).
               .config("spark.python.authenticate.socketTimeout", "120s"))
    session = get_or_create(builder)  # a JVM that exited before its port is started again
    session.sparkContext.setLogLevel("ERROR")
    txmq_pipeline.register(session)
    try:
        yield session
    finally:
        session.stop()


#: Sub-second checks: first check 0.5 s after the half message, check_max 2
#: (tests/support/presets.py).
PIPELINE_BROKER_ENV = presets.PIPELINE_BROKER
PIPELINE_CHECKER_ENV = presets.QUICK_CHECKER


@pytest.fixture(scope="session")
def txmq_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Two brokers, a name server and a checker shared by the pipeline tests that do not
    break their cluster (each uses topics and groups of its own)."""
    from tests.support.cluster import Cluster

    c = Cluster(tmp_path_factory.mktemp("pipeline-cluster"), brokers=2, broker_env=PIPELINE_BROKER_ENV,
                checker=True, checker_env=PIPELINE_CHECKER_ENV)
    try:
        yield c
    finally:
        c.stop()
