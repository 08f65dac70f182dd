"""The SparkSession of txmq_pipeline's entry points, with Python workers that can import
``txmq_pipeline`` and ``txmq``.

Spark starts its Python workers (and the processes that plan Python data sources) with
``spark.pyspark.python``, else ``$PYSPARK_PYTHON``, else ``python3`` from ``PATH`` — for a
user in a virtual environment, a system interpreter without our packages, so every task
dies with ``ModuleNotFoundError: No module named 'txmq_pipeline'``. For a local master the
workers run on this machine, so the interpreter running the driver is the right one:
:func:`session` sets both to ``sys.executable`` unless the user chose one.

For a cluster master (``k8s://``, ``spark://``, ``yarn``) the executors' interpreter is
the image's: nothing is set here; ship the packages in the image or with ``--py-files``
(see pipeline/README.md).

On a busy machine the JVM and its Python processes can take longer than Spark's 15 s to
connect to each other (``spark.python.authenticate.socketTimeout``): :data:`DEFAULTS` raises
it for every master. No setting lengthens the 10 s Spark waits for a streaming Python
source's process to connect back (PySpark 4.3 hard-codes it; the batch reads' processes
start through Spark's daemon, without that limit): the continuous audit copes with that
itself (:mod:`txmq_pipeline.follow`).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any, Mapping

log = logging.getLogger(__name__)

#: For every master (only keys the user's --conf / spark-defaults left unset).
DEFAULTS = {
    # How long the JVM and a Python process it talks to wait for each other's connection
    # and its authentication: the driver fetching a result or handing over local rows, a
    # worker or a data source's planner connecting back. Spark's 15 s can be too short on
    # a busy machine, and waiting longer for a local connection loses nothing.
    "spark.python.authenticate.socketTimeout": "120s",
}

#: Quiet defaults for a local run (only keys the user's --conf / spark-defaults left unset).
LOCAL_DEFAULTS = {
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    # 200 shuffle partitions are made for clusters; on one machine they are 200 tasks per
    # shuffle for a handful of cores (the continuous audit shuffles every interval).
    "spark.sql.shuffle.partitions": "8",
}


def effective_master(master: str | None) -> str:
    """The master the session will use: ``master``, else what spark-submit/--conf set,
    else PySpark's own default ``local[*]``."""
    if master:
        return master
    from pyspark import SparkConf, SparkContext

    if os.environ.get("PYSPARK_GATEWAY_PORT"):
        # Under spark-submit: its --master/--conf are in the JVM it started; connect to read them.
        SparkContext._ensure_initialized()
    return SparkConf().get("spark.master", None) or "local[*]"


def is_local(master: str) -> bool:
    return master == "local" or master.startswith("local[") or master.startswith("local-cluster[")


def python_for_workers(master: str) -> str | None:
    """The interpreter the workers should run for ``master`` (None: leave Spark's choice)."""
    if not is_local(master):
        return None
    from pyspark import SparkConf

    chosen = SparkConf().get("spark.pyspark.python", None) or os.environ.get("PYSPARK_PYTHON")
    return chosen or sys.executable


def defaults(master: str, given: Any = None) -> dict[str, str]:
    """The settings :func:`session` adds for ``master``: :data:`DEFAULTS`, and for a local
    master :data:`LOCAL_DEFAULTS`, where the user's configuration (``given``, a SparkConf;
    default: the one spark-submit and spark-defaults make) has none."""
    from pyspark import SparkConf

    given = SparkConf() if given is None else given
    chosen = {**DEFAULTS, **(LOCAL_DEFAULTS if is_local(master) else {})}
    return {key: value for key, value in chosen.items() if not given.contains(key)}


def session(app_name: str, master: str | None = None, conf: Mapping[str, str] | None = None) -> Any:
    """A SparkSession for ``app_name`` with the ``txmq`` data source registered; for a
    local master its Python workers run this interpreter (``sys.executable``) unless
    ``spark.pyspark.python``/``PYSPARK_PYTHON`` say otherwise."""
    from pyspark.sql import SparkSession

    import txmq_pipeline

    resolved = effective_master(master)
    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(master)
    python = python_for_workers(resolved)
    if python is not None:
        # The environment variable reaches the JVM (started below, it inherits it) and
        # the Python side; the conf is what executors and data source planners read.
        os.environ.setdefault("PYSPARK_PYTHON", python)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        builder = builder.config("spark.pyspark.python", python)
        log.info("Spark master %s: Python workers run %s", resolved, python)
    for key, value in {**defaults(resolved), **(conf or {})}.items():
        builder = builder.config(key, value)
    spark = get_or_create(builder)
    txmq_pipeline.register(spark)
    return spark


#: Starts of the JVM that exited before handing over its port, and the pause between two.
JVM_START_ATTEMPTS = 3
JVM_START_PAUSE_SECONDS = 2.0


def get_or_create(builder: Any) -> Any:
    """``builder.getOrCreate()``, started again (up to :data:`JVM_START_ATTEMPTS` in all)
    when the JVM exits before handing over its port (``JAVA_GATEWAY_EXITED``): seen on a
    busy machine whose threads ran out for a moment (``pthread_create failed: Resource
    temporarily unavailable``), a transient for a job that a scheduler would otherwise
    count as failed. Any other error is raised as it is."""
    from pyspark.errors import PySparkRuntimeError

    for attempt in range(1, JVM_START_ATTEMPTS + 1):
        try:
            return builder.getOrCreate()
        except PySparkRuntimeError as exc:
            if "JAVA_GATEWAY_EXITED" not in str(exc) or attempt == JVM_START_ATTEMPTS:
                raise
            log.warning("the JVM exited before handing over its port (start %d of %d); starting it again in %.0f s",
                        attempt, JVM_START_ATTEMPTS, JVM_START_PAUSE_SECONDS)
            time.sleep(JVM_START_PAUSE_SECONDS)
    raise AssertionError("unreachable")
