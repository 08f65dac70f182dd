"""txmq on Spark.

- :class:`TxmqDataSource`, the PySpark data source ``txmq``: batch reads of a topic (one
  partition per broker queue, offset and time bounds) and of the transaction table
  (``option("table", "transactions")``), streaming reads with per-(broker, queue) offsets
  kept in Spark's checkpoint, and a transactional streaming sink.
- :class:`SinkCheckResponder`: answers the checks of the sink's producer group from the
  query's checkpoint while the query runs.
- ``python -m txmq_pipeline.audit``: the transaction audit job.

Register the source once per session::

    import txmq_pipeline
    txmq_pipeline.register(spark)
    df = spark.read.format("txmq").option("nameserver", "ns:9876").option("topic", "orders").load()
"""

from __future__ import annotations

from typing import Any

from .sink import SinkCheckResponder
from .source import TxmqDataSource

__all__ = ["SinkCheckResponder", "TxmqDataSource", "register"]


def register(spark: Any) -> None:
    """Registers the ``txmq`` data source with ``spark`` (a SparkSession)."""
    spark.dataSource.register(TxmqDataSource)
